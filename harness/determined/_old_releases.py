"""Code written for TensorFlow 2.2 to 2.15 and NumPy 1.x, run on today's releases.

Determined's images shipped TensorFlow 2.2 to 2.15 with NumPy 1.x; localdet runs TensorFlow
2.21 (Keras 3, or Keras 2 as `tf_keras`) with NumPy 2. Where a release since then removed
or tightened something trial code uses, and the old meaning can be had exactly, a bridge
gives it back and says so once in the log (the old behaviour, the release that changed it,
what to write instead). The list with every removal's status is docs/old-releases.md.

Bridges (`install(config)` in a trial process, `bridged(...)` around a
checkpoint's load):

- NumPy aliases (always): `np.float`, `np.int`, `np.object`, `np.str`, `np.complex`,
  `np.unicode` (removed in 1.24), `np.asscalar` (1.23), `np.NaN`, `np.Inf`, `np.infty`,
  `np.float_`, `np.unicode_`, `np.product`, `np.cumproduct`, `np.alltrue`, `np.sometrue`,
  `np.msort`, `np.int0`, `np.bool8`, ... (2.0), `np.trapz`, `np.in1d` (2.4): NumPy's own
  module `__getattr__` refuses them; a wrapper around it returns the old meaning.
- Optimizer `lr=` and `decay=` (Keras 2.10 and before; on where the experiment's
  `environment.image` names TensorFlow 2.10 or older, or names none and the trial runs
  under Keras 2): `lr` is `learning_rate` (tf_keras's optimizers silently drop it, Keras 3
  refuses it), and `decay=d` is the learning rate `lr / (1 + d * iterations)` the
  optimizers of TensorFlow 2.10 and before computed, as an `InverseTimeDecay` schedule.
- The model's input check (TensorFlow 2.3 and before, Keras 2): a model built with
  `input_shape` and fed data of another shape ran with a warning, the data handed to the
  layers as it was; TensorFlow 2.4 made it an error. On where the image names 2.3 or older.
- `Sequential.predict_classes` / `predict_proba` (removed in 2.6), and under Keras 3
  `Model.fit_generator` / `evaluate_generator` / `predict_generator` (removed in 2.16):
  on where the image names a release that had them, or names none under Keras 2.

Everything is patched when the module it patches is imported (an import hook), so
installing costs nothing until TensorFlow or NumPy loads, and imports nothing itself.
`refusal(error)` gives the one sentence for what is not bridged.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

Release = Tuple[int, int]
_PREFIX = "[localdet] warning: "
_warned: set = set()


def _warn(key: str, message: str) -> None:
    """Once per bridge and process, on stderr (the trial log): `warnings` filters, Keras's
    own and a load's, would hide it."""
    if key not in _warned:
        _warned.add(key)
        print(_PREFIX + message, file=sys.stderr, flush=True)


# --- Which TensorFlow release the code was written for -------------------------------------

_RELEASE = r"(?:^|[-:/_.])(?:tf|tensorflow)-?(\d+)\.(\d+)"  # compiled when used: start-up


def release_of_image(image: Any) -> Optional[Release]:
    """The TensorFlow release an image (a name, or Determined's {cpu:, cuda:, ...}) names;
    the oldest where its names disagree."""
    names = image.values() if isinstance(image, dict) else \
        image if isinstance(image, (list, tuple)) else [image]
    found = [(int(m.group(1)), int(m.group(2))) for name in names if isinstance(name, str)
             for m in re.finditer(_RELEASE, name.rsplit("/", 1)[-1], re.IGNORECASE)]
    return min(found) if found else None


def release_named(config: Dict[str, Any]) -> Optional[Release]:
    """The release the experiment's `environment.image` names (kept in the parsed config for
    this alone: no container runs here)."""
    return release_of_image((config.get("environment") or {}).get("image"))


class Plan(NamedTuple):
    """Which Keras-side bridges a trial gets (the NumPy aliases are always on)."""

    release: Optional[Release]
    keras2: bool

    def _before(self, changed: Release) -> bool:
        """The code was written for a release before `changed`: the image says so, or it
        names none and the trial runs under Keras 2 (Determined's images: 2.2 to 2.15)."""
        return self.release < changed if self.release else self.keras2

    @property
    def optimizer_args(self) -> bool:
        return self._before((2, 11))

    @property
    def model_input_check(self) -> bool:
        return self.keras2 and self.release is not None and self.release < (2, 4)

    @property
    def predict_classes(self) -> bool:
        return self._before((2, 6))

    @property
    def generator_methods(self) -> bool:
        return not self.keras2 and self.release is not None and self.release < (2, 16)


def plan_for(config: Dict[str, Any]) -> Plan:
    return Plan(release_named(config), os.environ.get("TF_USE_LEGACY_KERAS") == "1")


# --- Patching a module when it is imported -------------------------------------------------

_undo: List[Callable[[], None]] = []


def _set(owner: Any, name: str, value: Any) -> None:
    """Patch `owner.name`, remembering how to put it back."""
    missing = object()
    old = owner.__dict__.get(name, missing) if isinstance(owner, type) else \
        getattr(owner, name, missing)

    def restore() -> None:
        if old is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
    setattr(owner, name, value)
    _undo.append(restore)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after the module it patches is executed."""

    def __init__(self) -> None:
        self.patches: Dict[str, List[Callable[[ModuleType], None]]] = {}
        self._finding: set = set()

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if name not in self.patches or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, patches = spec.loader, self.patches.pop(name)

        class _Patching(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                for patch in patches:
                    patch(module)

            def __getattr__(self, name: str) -> Any:  # get_source & co., for tracebacks
                return getattr(loader, name)
        spec.loader = _Patching()
        return spec


_finder = _AfterImport()


def _when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    _finder.patches.setdefault(name, []).append(patch)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


# --- NumPy ---------------------------------------------------------------------------------

def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


def _numpy_aliases(np: ModuleType) -> Dict[str, Tuple[Callable[[], Any], str, str]]:
    """name: (its old meaning, the NumPy release that removed it, what to write instead)."""
    def asscalar(a: Any) -> Any:
        return a.item()

    def asfarray(a: Any, dtype: Any = np.float64) -> Any:
        kind = np.dtype(dtype).type
        return np.asarray(a, dtype=kind if issubclass(kind, np.inexact) else np.float64)

    def issubclass_(arg1: Any, arg2: Any) -> bool:
        try:
            return issubclass(arg1, arg2)
        except TypeError:
            return False

    def msort(a: Any) -> Any:
        return np.sort(a, axis=0)

    def in1d(ar1: Any, ar2: Any, assume_unique: bool = False, invert: bool = False,
             **kwargs: Any) -> Any:
        return np.isin(np.asarray(ar1).ravel(), ar2, assume_unique=assume_unique,
                       invert=invert, **kwargs)

    table: Dict[str, Tuple[Callable[[], Any], str, str]] = {
        name: (_constant(value), "1.24", name)
        for name, value in (("float", float), ("int", int), ("object", object), ("str", str),
                            ("complex", complex))}
    table["unicode"] = (lambda: str, "1.24", "str")
    table["asscalar"] = (lambda: asscalar, "1.23", "a.item()")
    for names, value, instead in (
            (("NaN", "NAN"), lambda: np.nan, "np.nan"),
            (("Inf", "Infinity", "PINF", "infty"), lambda: np.inf, "np.inf"),
            (("NINF",), lambda: -np.inf, "-np.inf"), (("PZERO",), lambda: 0.0, "0.0"),
            (("NZERO",), lambda: -0.0, "-0.0"),
            (("float_",), lambda: np.float64, "np.float64"),
            (("complex_", "cfloat"), lambda: np.complex128, "np.complex128"),
            (("string_", "bytes0"), lambda: np.bytes_, "np.bytes_"),
            (("unicode_", "str0"), lambda: np.str_, "np.str_"),
            (("longfloat",), lambda: np.longdouble, "np.longdouble"),
            (("singlecomplex",), lambda: np.complex64, "np.complex64"),
            (("longcomplex", "clongfloat"), lambda: np.clongdouble, "np.clongdouble"),
            (("int0",), lambda: np.intp, "np.intp"), (("uint0",), lambda: np.uintp, "np.uintp"),
            (("bool8",), lambda: np.bool_, "np.bool_"),
            (("object0",), lambda: np.object_, "np.object_"),
            (("void0",), lambda: np.void, "np.void"),
            (("product",), lambda: np.prod, "np.prod"),
            (("cumproduct",), lambda: np.cumprod, "np.cumprod"),
            (("alltrue",), lambda: np.all, "np.all"), (("sometrue",), lambda: np.any, "np.any"),
            (("round_",), lambda: np.round, "np.round"),
            (("msort",), lambda: msort, "np.sort(a, axis=0)"),
            (("asfarray",), lambda: asfarray, "np.asarray(a, dtype=float)"),
            (("mat",), lambda: np.asmatrix, "np.asmatrix"),
            (("issubclass_",), lambda: issubclass_, "issubclass")):
        for name in names:
            table[name] = (value, "2.0", instead)
    table["trapz"] = (lambda: np.trapezoid, "2.4", "np.trapezoid")
    table["in1d"] = (lambda: in1d, "2.4", "np.isin(a, b).ravel()")
    return table


def _bridge_numpy(np: ModuleType) -> None:
    original = np.__dict__.get("__getattr__")
    if original is None or getattr(original, "_localdet_bridge", False):
        return
    table = _numpy_aliases(np)

    def __getattr__(name: str) -> Any:
        if name not in table:  # NumPy's own (its lazy submodules, its messages)
            return original(name)
        value, release, instead = table[name]
        _warn(f"numpy.{name}", f"np.{name} was removed in NumPy {release}; localdet maps it to "
                               f"{instead} for code written before it: replace it with {instead}")
        return value()
    __getattr__._localdet_bridge = True  # type: ignore[attr-defined]
    _set(np, "__getattr__", __getattr__)


# --- Optimizer arguments -------------------------------------------------------------------

def _old_learning_rate(owner: str, learning_rate: Any, lr: Any, decay: Any,
                       schedule_class: type, inverse_time: Callable[..., Any]) -> Any:
    """The learning rate the optimizers of TensorFlow 2.10 and before used for `lr` and
    `decay`: `lr` replaces `learning_rate`; `decay` divides it by (1 + decay * iterations)."""
    if lr is not None:
        _warn("optimizer.lr", f"{owner}(lr=...) is the learning_rate of optimizers up to "
                              "TensorFlow 2.10 (2.11 ignores it, Keras 3 refuses it); localdet "
                              "passes it as learning_rate: write learning_rate=")
        learning_rate = lr
    if decay:
        if isinstance(learning_rate, schedule_class):
            raise ValueError(f"{owner}(decay=...) with a LearningRateSchedule as learning rate "
                             "has no exact equivalent since TensorFlow 2.11: fold the decay "
                             "into the schedule, or use tf.keras.optimizers.legacy under "
                             "Keras 2")
        _warn("optimizer.decay", f"{owner}(decay=...) was removed in TensorFlow 2.11 (Keras 3 "
                                 "ignores it); localdet gives the learning rate it meant, "
                                 "lr / (1 + decay * iterations), as an InverseTimeDecay "
                                 "schedule: write learning_rate=tf.keras.optimizers.schedules."
                                 "InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)")
        learning_rate = inverse_time(learning_rate, decay_steps=1, decay_rate=decay)
    return learning_rate


def _bridge_tf_keras_optimizers(module: ModuleType) -> None:
    """tf_keras's optimizers (2.11 and after): `_process_kwargs` drops `lr` and refuses
    `decay` at the end of the base `__init__`, and the subclass then builds its learning rate:
    the old arguments are kept in between."""
    schedules = importlib.import_module(
        "tf_keras.src.optimizers.schedules.learning_rate_schedule")

    base, optimizer = module._BaseOptimizer, module.Optimizer
    process, build = base._process_kwargs, optimizer._build_learning_rate
    pending: Dict[int, Tuple[Any, Any]] = {}

    def _process_kwargs(self: Any, kwargs: Dict[str, Any]) -> None:
        old = (kwargs.pop("lr", None), kwargs.pop("decay", None))
        if old != (None, None):
            pending[id(self)] = old
        process(self, kwargs)

    def _build_learning_rate(self: Any, learning_rate: Any) -> Any:
        old = pending.pop(id(self), None)
        if old is not None:
            learning_rate = _old_learning_rate(
                type(self).__name__, learning_rate, *old, schedules.LearningRateSchedule,
                schedules.InverseTimeDecay)
        return build(self, learning_rate)
    _set(base, "_process_kwargs", _process_kwargs)
    _set(optimizer, "_build_learning_rate", _build_learning_rate)


def _bridge_keras3_optimizers(module: ModuleType) -> None:
    schedules = importlib.import_module("keras.src.optimizers.schedules.learning_rate_schedule")

    base = module.BaseOptimizer
    init = base.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        lr, decay = kwargs.pop("lr", None), kwargs.pop("decay", None)
        if lr is not None or decay:
            given = args[0] if args else kwargs.pop("learning_rate", None)
            rate = _old_learning_rate(type(self).__name__, given, lr, decay,
                                      schedules.LearningRateSchedule, schedules.InverseTimeDecay)
            args = (rate, *args[1:]) if args else args
            if not args:
                kwargs["learning_rate"] = rate
        init(self, *args, **kwargs)
    _set(base, "__init__", __init__)


# --- Models --------------------------------------------------------------------------------

def _bridge_model_input_check(module: ModuleType) -> None:
    """TensorFlow 2.3 and before did not check a model's inputs against the shape it was
    built with: it warned and handed the data to its layers, which ran or failed on it."""
    specs = importlib.import_module("tf_keras.src.engine.input_spec")

    functional = module.Functional
    spec_property = functional.__dict__["input_spec"]

    def model_specs(self: Any) -> Any:
        found = spec_property.fget(self)
        if found is not None and not hasattr(self, "_manual_input_spec"):
            for spec in found:
                spec._localdet_model_input = True
        return found
    check = specs.assert_input_compatibility

    def assert_input_compatibility(input_spec: Any, inputs: Any, layer_name: str) -> None:
        try:
            check(input_spec, inputs, layer_name)
        except ValueError as error:
            listed = input_spec if isinstance(input_spec, (list, tuple)) else [input_spec]
            if not listed or not all(getattr(s, "_localdet_model_input", False) for s in listed):
                raise
            first = " ".join(str(error).split())
            _warn("model.input_check", f"{first} TensorFlow 2.3 and before ran such a model "
                                       "with a warning, handing the data to its layers as it "
                                       "is, and 2.4 made it an error; localdet does as 2.3 did "
                                       "for this code: give the model the input_shape of its "
                                       "data (or reshape the data)")
    _set(functional, "input_spec", property(model_specs, spec_property.fset))
    _set(specs, "assert_input_compatibility", assert_input_compatibility)


def _bridge_predict_classes(sequential: type) -> None:
    def predict_classes(self: Any, x: Any, batch_size: int = 32, verbose: int = 0) -> Any:
        _warn("model.predict_classes", "Sequential.predict_classes was removed in TensorFlow "
                                       "2.6; localdet gives its old result: write "
                                       "np.argmax(model.predict(x), axis=-1) (or (model."
                                       "predict(x) > 0.5).astype('int32') for one unit)")
        proba = self.predict(x, batch_size=batch_size, verbose=verbose)
        return proba.argmax(axis=-1) if proba.shape[-1] > 1 else (proba > 0.5).astype("int32")

    def predict_proba(self: Any, x: Any, batch_size: int = 32, verbose: int = 0) -> Any:
        _warn("model.predict_proba", "Sequential.predict_proba was removed in TensorFlow 2.6; "
                                     "localdet gives model.predict(x), as it did: write that")
        return self.predict(x, batch_size=batch_size, verbose=verbose)
    for name, method in (("predict_classes", predict_classes), ("predict_proba", predict_proba)):
        if not hasattr(sequential, name):
            _set(sequential, name, method)


_LOADER_ONLY = ("max_queue_size", "workers", "use_multiprocessing")


def _bridge_generator_methods(model: type) -> None:
    """Keras 3 has no `*_generator` methods: `fit`, `evaluate` and `predict` take a
    generator. The data-loading options of the old methods do not change results."""
    def bridged(name: str, method: str) -> Callable[..., Any]:
        def call(self: Any, generator: Any, *args: Any, **kwargs: Any) -> Any:
            _warn(f"model.{name}", f"Model.{name} was removed in TensorFlow 2.16 (Keras 3); "
                                   f"localdet calls model.{method}, which takes the same "
                                   f"generator: write model.{method}(...)")
            for key in _LOADER_ONLY:
                kwargs.pop(key, None)
            return getattr(self, method)(generator, *args, **kwargs)
        call.__name__ = name
        return call
    for name, method in (("fit_generator", "fit"), ("evaluate_generator", "evaluate"),
                         ("predict_generator", "predict")):
        if not hasattr(model, name):
            _set(model, name, bridged(name, method))


# --- Installing ----------------------------------------------------------------------------

# keras.src and tf_keras.src modules patched here: checked against keras 3.15 and tf-keras
# 2.21 (pyproject's bounds <3.16, <2.22).
def _install(plan: Plan) -> None:
    _when_imported("numpy", _bridge_numpy)
    if plan.keras2:
        if plan.optimizer_args:
            _when_imported("tf_keras.src.optimizers.optimizer", _bridge_tf_keras_optimizers)
        if plan.model_input_check:
            _when_imported("tf_keras.src.engine.functional", _bridge_model_input_check)
        if plan.predict_classes:
            _when_imported("tf_keras.src.engine.sequential",
                           lambda m: _bridge_predict_classes(m.Sequential))
        return
    if plan.optimizer_args:
        _when_imported("keras.src.optimizers.base_optimizer", _bridge_keras3_optimizers)
    if plan.predict_classes:
        _when_imported("keras.src.models.sequential",
                       lambda m: _bridge_predict_classes(m.Sequential))
    if plan.generator_methods:
        _when_imported("keras.src.models.model", lambda m: _bridge_generator_methods(m.Model))


def install(config: Dict[str, Any]) -> Plan:
    """In a trial process, before the trial's code is imported: the bridges for this
    experiment, for the rest of the process."""
    plan = plan_for(config)
    _install(plan)
    return plan


@contextlib.contextmanager
def bridged(config: Dict[str, Any]) -> Iterator[Plan]:
    """Around loading a checkpoint in someone's own process: the bridges its code needs,
    taken away again afterwards."""
    mark = len(_undo)
    pending = {name: list(patches) for name, patches in _finder.patches.items()}
    plan = install(config)
    try:
        yield plan
    finally:
        while len(_undo) > mark:
            _undo.pop()()
        _finder.patches.clear()
        _finder.patches.update(pending)
        if not pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


# --- What is not bridged -------------------------------------------------------------------

_REFUSALS: Tuple[Tuple[str, str], ...] = (
    (r"Input \d+ of layer .* is incompatible with the layer: expected shape|"
     r"Invalid input shape for input",
     "the model was built for another input shape than its data has: TensorFlow 2.4 and "
     "later refuse that (2.3 warned; localdet keeps 2.3's way only under Keras 2 for code "
     "whose environment.image names TensorFlow 2.3 or older), so give the model the "
     "input_shape of its data or reshape the data"),
    (r"object has no attribute '(fit|evaluate|predict)_generator'",
     "Model.fit_generator, evaluate_generator and predict_generator were removed in "
     "TensorFlow 2.16 (Keras 3): call fit, evaluate or predict with the same generator"),
    (r"object has no attribute 'predict_(classes|proba)'",
     "Sequential.predict_classes and predict_proba were removed in TensorFlow 2.6: use "
     "np.argmax(model.predict(x), axis=-1), or model.predict(x)"),
)


def refusal(error: BaseException) -> Optional[str]:
    """For a removal localdet did not bridge: the error's own line that says what failed
    (a traced error's first line is only "in user code:"), then what to change."""
    for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines():
        for pattern, sentence in _REFUSALS:
            if re.search(pattern, line):
                said = re.sub(r"^\w+(Error|Exception): ", "", line.strip())  # traced: repeated
                return f"{type(error).__name__}: {said} ({sentence})"
    return None
