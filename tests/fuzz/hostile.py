"""Hostile submissions for tests/test_fuzz_intake.py, made by a seeded generator.

    cases = generate(random.Random(14), outside=Path("/tmp/x/outside"))
    for case in cases:
        make(case, drops / case.name)      # then move it into the queue (or queue/jobs)

What must become of each case (`expect`):
- REJECTED: moved to queue/rejected/<name>/ with a one-line error.txt naming `says`;
- ACCEPTED: recorded as an experiment named `says` (odd, but what a user may well do);
- ERROR: accepted, its trial ends ERROR with `says` (the cause) in its error.

Accepted configs set `resources.max_slots: 0`, so they are recorded but never train.
The slowly written submissions are not here: the test writes those itself, over seconds.
"""

from __future__ import annotations

import copy
import json
import os
import random
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

REJECTED, ACCEPTED, ERROR = "rejected", "accepted", "error"
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "state" / "expconf.schema.json")
                    .read_text())


@dataclass(frozen=True)
class Link:
    target: str  # what the symbolic link points to, as written


@dataclass(frozen=True)
class Special:
    kind: str  # "fifo" or "socket"


@dataclass
class Case:
    name: str
    category: str
    expect: str
    says: str
    entry: object  # bytes (a file), dict of relative path -> bytes/Link/Special (a folder),
                   # or a Link/Special (the entry itself)
    job: bool = False
    later: bool = False  # dropped in the last batch (a name used again)


MODEL_DEF = b"class Trial:\n    pass\n"
BASE = {
    "name": "fuzz",
    "entrypoint": "model_def:Trial",
    "hyperparameters": {"global_batch_size": 8,
                        "lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 4}},
    "resources": {"max_slots": 0},  # recorded, never scheduled
    "max_restarts": 0,
}
JOB = {"name": "fuzz-job", "entrypoint_script": "python3 infer.py", "resources": {"slots": 1}}


def dump(config) -> bytes:
    return yaml.safe_dump(config, allow_unicode=True, sort_keys=False).encode("utf-8")


def changed(path: str, value, base: dict = BASE) -> dict:
    """A copy of `base` with the dotted `path` set to `value`."""
    config = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return config


def folder(config: bytes, **extra) -> dict:
    return {"const.yaml": config, "model_def.py": MODEL_DEF, **extra}


# -- the schema's keys, for wrong types and bad numbers -------------------------------------

def _resolve(node: dict) -> dict:
    while "$ref" in node or ("allOf" in node and "type" not in node):
        ref = node["$ref"] if "$ref" in node else node["allOf"][0]["$ref"]
        node = {**SCHEMA["$defs"][ref.split("/")[-1]],
                **{k: v for k, v in node.items() if k not in ("$ref", "allOf")}}
    return node


def schema_keys(node: dict = SCHEMA, path: str = "") -> list[tuple[str, list[str]]]:
    """(dotted path, accepted JSON types) of every key an experiment config may set, x-ignored
    ones left out; an enum's types are ["enum"]."""
    keys = []
    for name, sub in node.get("properties", {}).items():
        if not isinstance(sub, dict) or "x-ignored" in sub:
            continue
        sub = _resolve(sub)
        here = f"{path}.{name}" if path else name
        types = sub.get("type")
        if isinstance(types, str):
            types = [types]
        types = types or (["enum"] if "enum" in sub else None)
        if types:
            keys.append((here, types))
        if "object" in (types or []) and sub.get("properties"):
            keys += schema_keys(sub, here)
    return keys


# No null: as in Determined's configs, null means the key's default (localdet/config/releases.py).
WRONG = {"string": "text", "integer": 7, "number": 2.5, "boolean": True, "array": [1, 2],
         "object": {"k": 1}}


def wrong_values(types: list[str]) -> list:
    if types == ["enum"]:
        return ["bogus", 7, [1]]
    accepted = set(types) | ({"integer"} if "number" in types else set())
    return [value for kind, value in WRONG.items() if kind not in accepted]


def config_for(path: str, value) -> dict:
    config = changed(path, value)
    if path.startswith("entrypoint_script"):
        del config["entrypoint"]  # one of the two, or the error is about having both
    return config


# -- the generator --------------------------------------------------------------------------

def generate(rng: random.Random, outside: Path) -> list[Case]:
    cases: list[Case] = []

    def add(slug: str, category: str, expect: str, says: str, entry, **more) -> None:
        name = f"{len(cases):03d}-{slug}"
        if isinstance(entry, bytes) and not slug.endswith((".yaml", ".yml")):
            name += rng.choice([".yaml", ".yml"])
        cases.append(Case(name, category, expect, says, entry, **more))

    def bad(slug: str, category: str, says: str, config: dict, as_folder: bool | None = None):
        text = dump(config)
        if as_folder if as_folder is not None else rng.random() < 0.3:
            add(slug, category, REJECTED, says, folder(text))
        else:
            add(slug, category, REJECTED, says, text)

    # Invalid YAML.
    for text in ["name: [unclosed\n", "a: b: c\n", "searcher:\n  name: single\n name: x\n",
                 "\tname: tabbed\n", "a: 1\na: 2\n", "a: *undefined\n", "a: 1\n---\nb: 2\n",
                 "data: !!python/object/apply:os.system ['touch /tmp/pwned']\n",
                 "name: \"unterminated\n", "- a\nb: c\n", "{", "]", "a: 'it''s\n",
                 "name: x\x07\n", "name: a\x00b\n", "? [1, 2]\n: x\n", "a: !!int nope\n",
                 "a: !!float x\n", "a: !!bool maybe\n", "a: !!timestamp never\n",
                 "a: !!str [1]\n", "a: !!map [1]\n"]:
        add("invalid-yaml", "invalid YAML", REJECTED, "invalid YAML", text.encode())

    # Aliases that expand exponentially, or into themselves.
    laughs = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    nested = "\n".join("  " + line for line in laughs)
    base = dump(BASE).decode()
    add("billion-laughs", "aliases", REJECTED, "values", f"{base}data:\n{nested}\n".encode())
    add("laughs-top", "aliases", REJECTED, "values", ("\n".join(laughs) + "\n").encode())
    mapping = ["m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}"]
    mapping += [f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(8))}}}"
                for i in range(1, 9)]
    add("laughs-mappings", "aliases", REJECTED, "values",
        (base + "data:\n" + "\n".join("  " + line for line in mapping) + "\n").encode())
    add("laughs-merge", "aliases", REJECTED, "values", (
        base + "data:\n  a: &a {x: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n" + "".join(
            f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 12)}]\n"
            for i in range(7))).encode())
    add("alias-loop-map", "aliases", REJECTED, "alias", (base + "data: &x\n  self: *x\n").encode())
    add("alias-loop-list", "aliases", REJECTED, "alias", (base + "labels: &x [*x]\n").encode())

    # Top levels that are no mapping.
    for slug, text, says in [("list", "- a\n- b\n", "top level"), ("int", "42\n", "top level"),
                             ("string", "just words\n", "top level"),
                             ("float", ".nan\n", "top level"), ("bool", "true\n", "top level"),
                             ("empty", "", "empty"), ("null", "~\n", "empty"),
                             ("comment-only", "# nothing\n", "empty"),
                             ("nested-lists", "[[[[1]]]]\n", "top level"),
                             ("deep", "[" * 50_000 + "]" * 50_000 + "\n", "nested too deeply"),
                             ("deep-map", "a: {" * 5_000 + "}" * 5_000 + "\n",
                              "nested too deeply")]:
        add(f"top-{slug}", "top level", REJECTED, says, text.encode())

    # Every key with a wrong type (two of its wrong values, chosen by the seed).
    for path, types in schema_keys():
        values = wrong_values(types)
        for value in rng.sample(values, min(2, len(values))):
            bad(f"type-{path}", "wrong type", path, config_for(path, value))

    # NaN and infinities, wherever a number goes.
    numeric = [(p, t) for p, t in schema_keys() if {"integer", "number"} & set(t)]
    for path, _ in numeric:
        value = rng.choice([float("nan"), float("inf"), float("-inf")])
        bad(f"nan-{path}", "NaN and infinity", path, config_for(path, value))
    for path, value in [("hyperparameters.lr.minval", float("nan")),
                        ("hyperparameters.lr.maxval", float("inf")),
                        ("hyperparameters.dropout", float("nan")),
                        ("hyperparameters.widths", {"type": "categorical",
                                                    "vals": [1.0, float("-inf")]}),
                        ("data.threshold", float("inf"))]:
        bad(f"nan-{path}", "NaN and infinity", path.rsplit(".", 1)[0] if "widths" in path
            else path, changed(path, value))

    # Lengths (and counts) of zero and below.
    epochs = {**BASE, "records_per_epoch": 100}
    for path, value, base_config in [
            ("searcher.max_length.batches", 0, BASE), ("searcher.max_length.batches", -1, BASE),
            ("searcher.max_length", {"records": 0}, BASE),
            ("searcher.max_length", {"epochs": -3}, epochs),
            ("searcher.max_length", 0, BASE), ("searcher.max_length", -5, BASE),
            ("min_validation_period.batches", -1, BASE),
            ("min_checkpoint_period.epochs", -1, epochs), ("scheduling_unit", 0, BASE),
            ("scheduling_unit", -5, BASE), ("records_per_epoch", -1, BASE),
            ("max_restarts", -1, BASE), ("resources.slots_per_trial", 0, BASE),
            ("resources.slots_per_trial", -1, BASE), ("resources.max_slots", -1, BASE),
            ("hyperparameters.global_batch_size", 0, BASE),
            ("hyperparameters.global_batch_size", -8, BASE),
            ("searcher.max_concurrent_trials", -1, BASE),
            ("checkpoint_storage.save_trial_best", -1, BASE),
            ("reproducibility.experiment_seed", -1, BASE), ("entrypoint", "", BASE),
            ("searcher.metric", "", BASE), ("resources.max_memory", "0GB", BASE),
            ("resources.max_memory", -1, BASE)]:
        bad(f"zero-{path}", "zero and below", path, changed(path, value, base_config))
    bad("zero-count", "zero and below", "hyperparameters.lr.count",
        changed("hyperparameters.lr.count", 0))
    bad("zero-vals", "zero and below", "hyperparameters.opt.vals",
        changed("hyperparameters.opt", {"type": "categorical", "vals": []}))
    bad("zero-max-trials", "zero and below", "searcher.max_trials",
        changed("searcher", {"name": "random", "metric": "val_loss", "max_trials": 0,
                             "max_length": {"batches": 4}}))

    # Huge numbers.
    grid = changed("searcher.name", "grid")
    for i in range(3):
        grid["hyperparameters"][f"h{i}"] = {"type": "double", "minval": 0, "maxval": 1,
                                            "count": 10**6}
    del grid["hyperparameters"]["lr"]
    for slug, says, config in [
            ("max_restarts", "max_restarts", changed("max_restarts", 10**30)),
            ("scheduling_unit", "scheduling_unit", changed("scheduling_unit", 10**20)),
            ("batches", "searcher.max_length.batches",
             changed("searcher.max_length.batches", 10**100)),
            ("records_per_epoch", "records_per_epoch", changed("records_per_epoch", 2**53 + 1)),
            ("seed", "reproducibility.experiment_seed",
             changed("reproducibility.experiment_seed", 10**12)),
            ("priority", "resources.priority", changed("resources.priority", -10**30)),
            ("const", "hyperparameters.big", changed("hyperparameters.big", 10**40)),
            ("int-range", "hyperparameters.n.maxval",
             changed("hyperparameters.n", {"type": "int", "minval": 0, "maxval": 10**20})),
            ("double-range", "hyperparameters.lr",
             changed("hyperparameters.lr", {"type": "double", "minval": -1e308, "maxval": 1e308})),
            ("log-range", "hyperparameters.lr",
             changed("hyperparameters.lr", {"type": "log", "minval": -3, "maxval": 400})),
            ("epochs", "searcher.max_length",
             {**changed("searcher.max_length", {"epochs": 2**40}), "records_per_epoch": 2**52}),
            ("max-trials", "searcher.max_trials", changed("searcher.max_trials", 10**19)),
            ("grid", "hyperparameters", grid),
            ("max_memory", "resources.max_memory", changed("resources.max_memory", "999999TB")),
            ("slots", "resources.slots_per_trial", changed("resources.slots_per_trial", 2**40))]:
        bad(f"huge-{slug}", "huge numbers", says, config)
    add("huge-float-literal", "huge numbers", REJECTED, "max_restarts",
        dump(BASE) + b"max_restarts: 1e999\n")

    # Size: far over the limit, just over it, and under it with too many values.
    padding = b"# " + b"x" * 1000 + b"\n"
    add("config-50MB", "size", REJECTED, "MB",
        folder(dump(BASE) + padding * (50 * 1000)))
    add("config-1.5MB", "size", REJECTED, "MB", dump(BASE) + padding * 1500)
    add("values-900KB", "size", REJECTED, "values",
        dump(BASE) + b"data:\n  xs: [" + b"1," * 400_000 + b"1]\n")
    add("long-description", "size", ACCEPTED, "long description",
        dump({**BASE, "name": "long description", "description": "word " * 150_000}))

    # Binary and non-UTF-8 bytes.
    noise = bytes([0xFF]) + bytes(rng.randrange(256) for _ in range(4096))
    add("random-bytes", "binary", REJECTED, "not UTF-8", noise)
    add("latin-1", "binary", REJECTED, "not UTF-8", dump(BASE).replace(b"fuzz", b"caf\xe9"))
    add("utf-16", "binary", REJECTED, "not UTF-8",
        dump(BASE).decode().encode("utf-16"))
    add("png", "binary", REJECTED, "not UTF-8", b"\x89PNG\r\n\x1a\n" + noise[:512])
    add("surrogate-escape", "binary", REJECTED, "name",
        dump(BASE).replace(b"name: fuzz", b'name: "\\udcff"'))
    add("yaml-binary-tag", "binary", REJECTED, "data", dump(BASE) + b"data: !!binary aGVsbG8=\n")
    add("yaml-date", "binary", REJECTED, "description", dump(BASE) + b"description: 2026-01-02\n")
    add("not-utf8-inner-name", "binary", REJECTED, "not valid UTF-8",
        folder(dump(BASE), **{os.fsdecode(b"data\xff.bin"): b"1"}))
    cases.append(Case(os.fsdecode(f"{len(cases):03d}-not-utf8-\xfe".encode("latin-1")),
                      "binary", REJECTED, "not valid UTF-8", folder(dump(BASE))))
    add("binary-data-files", "binary", ACCEPTED, "binary data files", folder(
        dump({**BASE, "name": "binary data files"}), **{"weights.bin": noise,
                                                       "notes-latin1.txt": b"caf\xe9\n"}))

    # Names: accepted when the config is good (a user may name things so), one line when not.
    for entry_name, experiment_name in [("my experiment", "my experiment"),
                                        ("line\nbreak", "line\nbreak"),
                                        ("café ñandú 実験", "café ñandú 実験"),
                                        ("two words.yaml", "two words"),
                                        ("Ünïcödé\nnewline.yml", "Ünïcödé")]:
        config = dump({**BASE, "name": experiment_name})
        entry = config if entry_name.endswith((".yaml", ".yml")) else folder(config)
        cases.append(Case(f"{len(cases):03d}-{entry_name}", "names", ACCEPTED, experiment_name,
                          entry))
    for entry_name in ["bad\nname.yaml", "tab\there\x1b[31m.yaml", "x" * 240, "é" * 120 + ".yml",
                       " leading and trailing spaces .yaml"]:
        config = dump(changed("max_restarts", "many"))
        entry = config if entry_name.endswith((".yaml", ".yml")) else folder(config)
        cases.append(Case(f"{len(cases):03d}-{entry_name}", "names", REJECTED, "max_restarts",
                          entry))
    # The longest name again, later: its rejection must not collide with the first's.
    cases.append(Case(cases[-3].name, "names", REJECTED, "max_restarts", cases[-3].entry,
                      later=True))

    # Symbolic links out of the queue, to files and folders; and within the submission.
    good = dump(BASE)
    secret, elsewhere = str(outside / "secret.yaml"), str(outside / "folder")
    for slug, entry, says in [
            ("top-link-file.yaml", Link(secret), "symbolic link"),
            ("top-link-folder", Link(elsewhere), "symbolic link"),
            ("top-link-relative", Link("../../outside/folder"), "symbolic link"),
            ("config-link", {"const.yaml": Link(secret), "model_def.py": MODEL_DEF},
             "symbolic link"),
            ("code-link", folder(good, **{"model_def.py": Link(f"{elsewhere}/model_def.py")}),
             "symbolic link"),
            ("folder-link", folder(good, lib=Link(elsewhere)), "symbolic link"),
            ("relative-escape", folder(good, **{"data.csv": Link("../../../outside/secret.yaml")}),
             "symbolic link"),
            ("deep-link", folder(good, **{"a/b/c": Link(f"{elsewhere}/sub")}), "symbolic link"),
            ("broken-link", folder(good, gone=Link("/nonexistent/file")), "symbolic link"),
            ("loop-link", folder(good, loop=Link("loop")), "symbolic link"),
            ("inner-folder-link", folder(good, **{"lib/x.py": b"X = 1\n", "alias": Link("lib")}),
             "symbolic link")]:
        add(f"symlink-{slug}", "symlinks", REJECTED, says, entry)
    add("symlink-job", "symlinks", REJECTED, "symbolic link",
        {"job.yaml": Link(secret), "infer.py": b"print('hi')\n"}, job=True)
    add("symlink-inside-to-file", "symlinks", ACCEPTED, "inner file link", folder(
        dump({**BASE, "name": "inner file link"}), **{"same_model.py": Link("model_def.py")}))

    # Folders with two configs, or none.
    for slug, files, says in [
            ("two-configs", {"const.yaml": good, "adaptive.yaml": good}, "several YAML files"),
            ("yaml-and-yml", {"a.yaml": good, "b.yml": good, "c.yaml": good},
             "several YAML files"),
            ("many-configs", {f"c{i}\n.yaml": good for i in range(7)}, "several YAML files"),
            ("no-config", {"model_def.py": MODEL_DEF}, "no experiment YAML"),
            ("nested-config-only", {"sub/const.yaml": good, "model_def.py": MODEL_DEF},
             "no experiment YAML"),
            ("empty-folder", {}, "no experiment YAML")]:
        add(f"configs-{slug}", "two configs", REJECTED, says, dict(files))
    add("configs-job-two", "two configs", REJECTED, "several YAML files",
        {"a.yaml": dump(JOB), "b.yaml": dump(JOB)}, job=True)

    # Special files.
    add("special-fifo.yaml", "special files", REJECTED, "not a regular file or folder",
        Special("fifo"))
    add("special-fifo-inside", "special files", REJECTED, "not a regular file or folder",
        folder(good, feed=Special("fifo")))
    add("special-socket-inside", "special files", REJECTED, "not a regular file or folder",
        folder(good, sock=Special("socket")))

    # Configs that validate as YAML and schema but ask for what cannot be.
    for slug, says, config in [
            ("unsupported-searcher", "searcher.name", changed("searcher.name", "pbt")),
            ("more-slots", "slots_per_trial", changed("resources.slots_per_trial", 3)),
            ("bad-entrypoint", "entrypoint", changed("entrypoint", "a:b:c")),
            ("env-no-equals", "environment.environment_variables[0]",
             changed("environment.environment_variables", ["NOEQUALS"])),
            ("grid-no-count", "count", changed("searcher.name", "grid")),
            ("random-no-max-trials", "max_trials", changed("searcher.name", "random")),
            ("epochs-no-records", "records_per_epoch",
             changed("searcher.max_length", {"epochs": 2})),
            ("typo", "serocher", {**{k: v for k, v in BASE.items() if k != "searcher"},
                                  "serocher": BASE["searcher"]}),
            ("no-entrypoint", "entrypoint", {k: v for k, v in BASE.items() if k != "entrypoint"}),
            ("both-entrypoints", "entrypoint_script",
             changed("entrypoint_script", "python3 train.py")),
            ("minval-over-maxval", "minval",
             changed("hyperparameters.lr", {"type": "int", "minval": 5, "maxval": 1})),
            ("no-searcher", "searcher", {k: v for k, v in BASE.items() if k != "searcher"}),
            ("nonstring-key", "data", None),
            ("engine", "resources.engine",
             changed("resources", {"slots_per_trial": 2, "engine": "horovod"}))]:
        if config is None:  # YAML that safe_dump would not write
            add(f"semantic-{slug}", "semantics", REJECTED, says, dump(BASE) + b"data:\n  1: one\n")
        else:
            bad(f"semantic-{slug}", "semantics", says, config)

    # Jobs (queue/jobs) with wrong values.
    for path, value in [("resources.slots", "two"), ("resources.slots", 0), ("max_restarts", -1),
                        ("entrypoint", "model_def:Trial"), ("data", [1]), ("name", 5),
                        ("environment.environment_variables", "A=1"), ("labels", "x")]:
        config = changed(path, value, JOB)
        if path == "entrypoint":
            del config["entrypoint_script"]
        add(f"job-{path}", "jobs", REJECTED, path,
            {"job.yaml": dump(config), "infer.py": b"print('hi')\n"}, job=True)
    return cases


def model_code_cases(start: int) -> list[Case]:
    """Submissions whose config is good and whose code fails: accepted, their trials end
    ERROR with the cause. `start` numbers their names after the others."""
    trial = {**BASE, "resources": {}}  # these run
    # (An unchanged script takes hyperparameters only as its options or constants: none here.)
    script = {k: v for k, v in trial.items()
              if k not in ("entrypoint", "searcher", "hyperparameters")}
    script["entrypoint"] = "python3 train.py"
    raising = b"raise RuntimeError('the model refuses to import')\n"
    exiting = b"import sys\nsys.exit(3)\n"
    hog = (b"import os\nimport time\nchunks = []\n"
           b"for _ in range(48):  # 3 GB at most, should the limit fail\n"
           b"    chunks.append(bytearray(os.urandom(1)) * (64 * 2**20))\n"
           b"    time.sleep(0.05)\n"
           b"raise RuntimeError('allocated 3 GB: the memory limit never stopped it')\n")
    return [
        Case(f"{start:03d}-code-raises-at-import", "model code", ERROR,
             "RuntimeError: the model refuses to import",
             {"const.yaml": dump({**trial, "name": "raises"}), "model_def.py": raising}),
        Case(f"{start + 1:03d}-code-exits-at-import", "model code", ERROR, "exit status 3",
             {"const.yaml": dump({**trial, "name": "exits"}), "model_def.py": exiting}),
        Case(f"{start + 2:03d}-code-script-exits", "model code", ERROR, "exit status 7",
             {"const.yaml": dump({**script, "name": "script exits"}),
              "train.py": b"import os\nos._exit(7)\n"}),
        Case(f"{start + 3:03d}-code-allocates", "model code", ERROR,
             "exceeded its memory limit of",
             {"const.yaml": dump({**script, "name": "allocates",
                                  "resources": {"max_memory": "200MB"}}), "train.py": hog}),
    ]


def make(case: Case, path: Path) -> None:
    """Write the case's entry at `path` (outside the queue; the test moves it in)."""
    def write(target: Path, content) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            os.symlink(content.target, target)
        elif isinstance(content, Special) and content.kind == "fifo":
            os.mkfifo(target)
        elif isinstance(content, Special):  # bound where the path is short enough, moved
            short = Path(tempfile.mkdtemp()) / "s"
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(short))
            os.rename(short, target)
            short.parent.rmdir()
        else:
            target.write_bytes(content)

    if isinstance(case.entry, dict):
        path.mkdir(parents=True)
        for relative, content in case.entry.items():
            write(path / relative, content)
    else:
        write(path, case.entry)
