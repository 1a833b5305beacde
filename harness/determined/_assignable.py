"""Attributes computed on read that user code may still assign, as it could assign the plain
attributes Determined's contexts had (`self.context.env.container_gpus = []` in a trial's
`__init__`). Both descriptors here define only `__get__`, so an assignment stores the value
on the instance and every later read returns it."""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, TypeVar, overload

from determined import errors

T = TypeVar("T")


class computed(Generic[T]):  # noqa: N801 - used as a decorator, like `property`
    """Like `property`, but assignable: the getter runs until the attribute is assigned."""

    def __init__(self, getter: Callable[[Any], T]) -> None:
        self.getter = getter
        self.__doc__ = getter.__doc__

    @overload
    def __get__(self, instance: None, owner: Optional[type] = None) -> "computed[T]": ...

    @overload
    def __get__(self, instance: Any, owner: Optional[type] = None) -> T: ...

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        return self.getter(instance)


class refused_attribute:  # noqa: N801 - a descriptor, named like one
    """An attribute that means nothing here: reading it raises `NotServedError` with one
    sentence, until user code assigns it a value of its own."""

    def __init__(self, what: str, instead: str) -> None:
        self.what, self.instead = what, instead

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        raise errors.refuse(self.what, self.instead)
