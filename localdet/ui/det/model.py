"""`det model` (`det m`): the model registry (named models, numbered versions, each naming
a checkpoint)."""

from __future__ import annotations

import json

import click

from localdet.ui.det import output
from localdet.ui.det.groups import AliasedGroup
from localdet.ui.det.state import reading, records, run


@click.group("model", cls=AliasedGroup, aliases={"ls": "list"}, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def command(ctx: click.Context) -> None:
    """manage models (`det m` alone lists them)"""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_models)


def _model_json(model: dict) -> dict:
    """A model as Determined's CLI printed it in JSON."""
    return {"name": model["name"], "id": model["id"], "description": model["description"],
            "creation_time": model["creation_time"],
            "last_updated_time": model["last_updated_time"], "metadata": model["metadata"],
            "archived": model["archived"], "labels": model.get("labels", []),
            "notes": model.get("notes", "")}


def render_model(model: dict) -> None:
    output.table(["ID", "Name", "Description", "Workspace ID", "Creation Time",
                  "Last Updated Time", "Metadata"],
                 [[model["id"], model["name"], model["description"], 1,
                   model["creation_time"], model["last_updated_time"],
                   json.dumps(model["metadata"] or {}, indent=4)]])


def render_versions(versions: list[dict]) -> None:
    rows = []
    for v in versions:
        checkpoint = v.get("checkpoint") or {}
        metadata = checkpoint.get("metadata") or {}
        rows.append([v["version"], checkpoint.get("trial_id"),
                     metadata.get("steps_completed", checkpoint.get("batches_trained")),
                     v["checkpoint_uuid"],
                     json.dumps(checkpoint.get("validation_metrics") or {}, indent=2),
                     json.dumps(metadata, indent=2)])
    output.table(["Version #", "Trial ID", "Batch #", "Checkpoint UUID", "Validation Metrics",
                  "Metadata"], rows)


@command.command("list")
@click.option("--sort-by", type=click.Choice(["name", "description", "creation_time",
                                              "last_updated_time"]),
              default="last_updated_time", show_default=True,
              help="sort models by the given field")
@click.option("--order-by", type=click.Choice(["asc", "desc"]), default="asc",
              show_default=True, help="order models in either ascending or descending order")
@click.option("-a", "--all", "show_all", is_flag=True, help="include archived models")
@click.option("-w", "--workspace-names", help="accepted and ignored: there are no workspaces")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_models(sort_by: str = "last_updated_time", order_by: str = "asc",
                show_all: bool = False, workspace_names: str | None = None,
                as_json: bool = False) -> None:
    """list all models in the registry"""
    from localdet.ui.det import state

    models: list[dict] = []
    if state.exists():
        from localdet.operations.registry import list_models as listed

        with reading(empty_ok=True) as (_, db):
            models = run(listed, db, archived=None if show_all else False, sort_by=sort_by,
                         order=order_by)
    if as_json:
        output.print_json([_model_json(m) for m in models])
        return
    output.table(["ID", "Name", "Workspace ID", "Creation Time", "Last Updated Time",
                  "Metadata"],
                 [[m["id"], m["name"], 1, m["creation_time"], m["last_updated_time"],
                   json.dumps(m["metadata"] or {}, indent=2)] for m in models])


@command.command("create")
@click.argument("name")
@click.option("--description", default="", help="description of the model")
@click.option("-w", "--workspace-name", help="accepted and ignored: there are no workspaces")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def create(name: str, description: str, workspace_name: str | None, as_json: bool) -> None:
    """create model"""
    from localdet.operations.registry import create_model

    with records(create=True) as (_, db):
        model = run(create_model, db, name, description=description)
    if as_json:
        output.print_json(_model_json(model))
    else:
        render_model(model)


@command.command("describe")
@click.argument("name")
@click.option("--version", "version", type=int, default=-1, show_default=True,
              help="model version information to include in output")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def describe(name: str, version: int, as_json: bool) -> None:
    """describe model"""
    from localdet.operations.registry import get_model, get_version

    with reading() as (_, db):
        model = run(get_model, db, name)
        found = run(get_version, db, name, version)
    if as_json:
        output.print_json(_model_json(model))
        return
    render_model(model)
    if found is not None:
        click.echo("\n")
        render_versions([found])


@command.command("register-version")
@click.argument("name")
@click.argument("uuid")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def register_version(name: str, uuid: str, as_json: bool) -> None:
    """register a new version of a model"""
    from localdet.operations.registry import get_model
    from localdet.operations.registry import register_version as register

    with records() as (_, db):
        version = run(register, db, name, uuid)
        model = run(get_model, db, name)
    if as_json:
        output.print_json(version)
        return
    render_model(model)
    click.echo("\n")
    render_versions([version])


@command.command("list-versions")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_versions(name: str, as_json: bool) -> None:
    """list the versions of a model"""
    from localdet.operations.registry import get_model
    from localdet.operations.registry import list_versions as listed

    with reading() as (_, db):
        model = run(get_model, db, name)
        versions = run(listed, db, name)
    if as_json:
        output.print_json({"model": _model_json(model), "modelVersions": versions})
        return
    render_model(model)
    click.echo("\n")
    render_versions(versions)


@command.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="automatically answer yes to prompts")
def delete(name: str, yes: bool) -> None:
    """delete model (with its versions; their checkpoints stay)"""
    from localdet.operations.registry import delete_model

    if not yes and not output.yes_or_no(f"Delete model {name} and all its versions?"):
        click.echo("Aborting model deletion.")
        return
    with records() as (_, db):
        run(delete_model, db, name)
    click.echo(f"Deleted model {name}")


@command.command("delete-version")
@click.argument("name")
@click.argument("version", type=click.IntRange(min=1))
@click.option("--yes", is_flag=True, help="automatically answer yes to prompts")
def delete_version(name: str, version: int, yes: bool) -> None:
    """delete one version of a model (its checkpoint stays until retention or gc takes it)"""
    from localdet.operations.registry import delete_version as delete

    if not yes and not output.yes_or_no(f"Delete version {version} of model {name}?"):
        click.echo("Aborting model version deletion.")
        return
    with records() as (_, db):
        deleted = run(delete, db, name, version)
    click.echo(f"Deleted version {version} of model {name} (checkpoint "
               f"{deleted['checkpoint']['uuid']})")


@command.command("move")
@click.argument("name")
@click.option("-w", "--workspace-name")
def move(name: str, workspace_name: str | None) -> None:
    """(refused: there are no workspaces)"""
    output.fail("`det model move` is refused: localdet has no workspaces; every model is in "
                "the one registry of $LOCALDET_HOME")
