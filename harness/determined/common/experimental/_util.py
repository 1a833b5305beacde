"""The sort order shared by the SDK's listings."""

import enum


class OrderBy(enum.Enum):
    """Ascending or descending, for the SDK's sorted listings (`ASC` and `ASCENDING` are
    the same member, as are `DESC` and `DESCENDING`)."""

    ASCENDING = "ORDER_BY_ASC"
    ASC = "ORDER_BY_ASC"
    DESCENDING = "ORDER_BY_DESC"
    DESC = "ORDER_BY_DESC"


def order_name(order_by: "enum.Enum | None") -> "str | None":
    """"asc", "desc" or None: how the backend spells an order, from `OrderBy` or one of
    Determined's older order enums (`ModelOrderBy`, `TrialOrderBy`, ...), same values."""
    if order_by is None:
        return None
    return "asc" if order_by.value == OrderBy.ASC.value else "desc"


def deprecated(what: str, instead: str) -> None:
    """The FutureWarning Determined gave for a name it was phasing out."""
    import warnings

    warnings.warn(f"{what} is deprecated (as in Determined); use {instead} instead.",
                  FutureWarning, stacklevel=3)
