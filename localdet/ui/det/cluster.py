"""Determined's cluster-only commands: each answers in one line that there is no cluster
here and what to use instead, with exit status 1, whatever its arguments."""

from __future__ import annotations

import sys

import click

# Determined's name -> what to use instead (one sentence).
INSTEAD = {
    "agent": "localdet runs on this machine alone; `localdet daemon --slots N` sets its slots",
    "slot": "`localdet daemon --slots N` sets the slots and `localdet status` shows what runs",
    "user": "there are no users or logins; everything belongs to whoever owns $LOCALDET_HOME",
    "user-group": "there are no users or groups",
    "rbac": "there are no users or roles",
    "token": "there are no logins or tokens",
    "auth": "there are no logins",
    "oauth": "there are no logins",
    "master": "there is no master: the state is the folder $LOCALDET_HOME and "
              "`localdet daemon` runs the experiments (its log is in daemon.log there)",
    "notebook": "start Jupyter yourself on this machine (`jupyter lab`)",
    "shell": "you already have a shell on this machine",
    "command": "run the command yourself, or `det job run CONFIG DIR` to schedule a script "
               "on the daemon's slots",
    "template": "put the settings in the experiment config itself, or add them with "
                "`det e create ... --config key=value`",
    "resource-pool": "the daemon's slots are the only pool (`localdet daemon --slots N`)",
    "resources": "`localdet status` shows what runs on the daemon's slots",
    "workspace": "experiments live in one state folder; use another LOCALDET_HOME to keep "
                 "sets apart, and labels (`det e label add`) to group them",
    "project": "experiments live in one state folder; use labels (`det e label add`) to "
               "group them",
    "tensorboard": "`localdet tensorboard EXPERIMENT_ID` serves TensorBoard over an "
                   "experiment's trials",
    "task": "`localdet status` lists what runs (experiments, trials and jobs)",
    "config-policies": "there are no cluster policies; the experiment config says it all",
    "deploy": "nothing to deploy: `localdet daemon` (or `det e create`, which starts it) runs "
              "everything on this machine",
    "dev": "there is no master API to call; the records are in $LOCALDET_HOME/localdet.db",
    "preview-search": "`localdet run CONFIG DIR` runs a search in the foreground",
}

# Determined's aliases of those nouns.
ALIASES = {name: name for name in INSTEAD} | {
    "a": "agent", "s": "slot", "u": "user", "cmd": "command", "tpl": "template",
    "rp": "resource-pool", "res": "resources", "w": "workspace", "p": "project",
    "tkn": "token", "cp": "config-policies", "d": "deploy",
}
NAMES = sorted(INSTEAD)


def refusal(name: str) -> click.Command:
    """A command that takes anything and refuses in one line."""

    @click.command(name, context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True,
                                           "help_option_names": []},
                   add_help_option=False)
    def refuse() -> None:
        click.echo(f"error: `det {name}` needs a Determined cluster, and localdet has none: "
                   f"{INSTEAD[name]}.", err=True)
        sys.exit(1)

    return refuse
