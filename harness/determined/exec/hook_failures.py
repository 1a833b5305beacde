"""The lines of a model folder's startup-hook.sh that failed or were refused, as the trial's
processes learn them (`LOCALDET_HOOK_FAILURES`, JSON set by localdet's hook runner), so that
an ImportError in the trial names the line that was installing the missing module:

    message = named(error, message)   # + "; startup-hook.sh line 3 (`pip install ...`) ..."

Standard library only, and nothing of `determined` imported: localdet copies this file into
an experiment's hook environment, where it runs at interpreter start (a `.pth` line calls
`install()`) to name the line for a script's uncaught ImportError too.
"""

import json
import os
import re
import sys

VAR = "LOCALDET_HOOK_FAILURES"
HOOK = "startup-hook.sh"
# determined.core._reporting.FAILURE_MARK (a test keeps the two equal): not imported, so
# that this file runs on its own.
FAILURE_MARK = "[localdet] failure: "

# Import names that differ from their distribution's name, for the distributions hooks
# install most often.
_DISTRIBUTIONS = {"cv2": ("opencv_python", "opencv_python_headless", "opencv_contrib_python"),
                  "sklearn": ("scikit_learn",), "skimage": ("scikit_image",),
                  "PIL": ("pillow",), "yaml": ("pyyaml",), "bs4": ("beautifulsoup4",),
                  "google": ("protobuf",), "attr": ("attrs",), "dateutil": ("python_dateutil",)}


def failures() -> list:
    """The failed lines: dicts of `line`, `command`, `reason` and `packages` (the names the
    line asked for; empty when it could not tell, e.g. a folder or a URL)."""
    try:
        found = json.loads(os.environ.get(VAR) or "[]")
    except ValueError:
        return []
    return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def lines_for(module: str) -> list:
    """The failed lines that were installing `module` (a top-level import name), or that
    could have been (they name no package this could rule out)."""
    top = module.split(".")[0]
    wanted = {_canonical(top), *_DISTRIBUTIONS.get(top, ())}
    named = [f for f in failures()
             if any(_canonical(p) in wanted or _canonical(p).endswith("_" + _canonical(top))
                    for p in f.get("packages") or ())]
    return named or [f for f in failures() if not f.get("packages")]


def _where(line: object) -> str:
    return f"{HOOK} line {line}" if str(line).isdigit() else f"a script {HOOK} ran"


def hint(error: BaseException) -> str:
    """What to add to an ImportError's message: the hook lines that failed to install the
    module; "" for any other error, or when no failed line concerns it."""
    if not isinstance(error, ImportError):
        return ""
    name = error.name or "".join(re.findall(r"named '([\w.]+)'", str(error))[:1])
    if not name:
        return ""
    found = lines_for(name)
    if not found:
        return ""
    told = "; and from ".join(f"{_where(f.get('line'))}, `{f.get('command')}`, which "
                              f"{f.get('reason')}" for f in found)
    return f"; it was to come from {told}"


def named(error: BaseException, message: str) -> str:
    """`message` (the error's one line) with the hook lines that failed to install it."""
    return message + hint(error)


_installed = False


def install() -> None:
    """For a process of the hook's environment, where the hook had failed lines: an
    uncaught ImportError they explain ends with one line naming them, and the failure mark
    the daemon reads (the trial's error then names them)."""
    global _installed
    # Its .pth runs twice where lib64 links to lib (the site folder is found under both).
    if _installed or not os.environ.get(VAR):
        return
    _installed = True
    previous = sys.excepthook

    def excepthook(kind, error, trace):
        previous(kind, error, trace)
        told = hint(error)
        if told:
            text = str(error).strip().splitlines()
            line = f"{kind.__name__}: {text[0]}" if text else kind.__name__
            print(f"error: {line}{told}", file=sys.stderr, flush=True)
            print(FAILURE_MARK + json.dumps({"signature": line, "message": line + told,
                                             "stage": None, "trained": None}),
                  file=sys.stderr, flush=True)

    sys.excepthook = excepthook
