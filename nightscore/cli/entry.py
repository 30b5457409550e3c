"""The nightscore command line assembled: every command on its app, and `main`, which maps a failure to its exit code.

Exit codes come from core.errors.EXIT_CODES: 0, 1 (failure), 2 (usage), 3 (contract), 130, 143.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import click
import pydantic
import typer
from typer.exceptions import TyperException

from core.errors import EXIT_KEYBOARD, EXIT_USAGE, NightscoreError, UsageError, exit_code_for, is_expected
from core.logs import to_log_file
from nightscore.cli import calibrate, data, run, serve, stack, warehouse
from nightscore.cli.app import INVOCATION

log = logging.getLogger("nightscore")


def build_app() -> typer.Typer:
    """Return the command line with every command and command group."""
    app = typer.Typer(
        add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Nightly and on-demand batch scoring."
    )
    app.callback()(_options)
    app.command("demo-data")(data.demo_data)
    app.command("query")(warehouse.query)
    app.command("runs")(warehouse.runs)
    app.command("serve")(serve.serve)
    app.command("calibrate")(calibrate.calibrate)
    app.command("prune")(data.prune)
    app.command("up")(stack.up)
    app.command("down")(stack.down)
    app.command("deploy")(stack.deploy)
    app.command("status")(stack.status)
    _group(app, "run", "Run a scoring flow.", {"nightly": run.run_nightly, "train-ranker": run.run_train_ranker})
    _group(app, "contracts", "Data contracts of the inputs.", {"check": data.contracts_check})
    _group(app, "cache", "Inspect or move the published candidate cache.", {"rollback": data.cache_rollback})
    _group(app, "events", "The online service's interaction events.", {"export": data.events_export})
    _group(app, "trigger", "Start a deployment's run through the Prefect API.", {"on-demand": stack.trigger_on_demand})
    return app


def _group(app: typer.Typer, name: str, help_text: str, commands: dict[str, Callable[..., None]]) -> None:
    """Add a command group (nightscore NAME COMMAND) with its commands."""
    group = typer.Typer(no_args_is_help=True, help=help_text)
    for command, function in commands.items():
        group.command(command)(function)
    app.add_typer(group, name=name)


def _options(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG and show tracebacks.")) -> None:
    """Nightly and on-demand batch scoring."""
    INVOCATION.verbose = verbose


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; failures print one line, never a bare traceback (see core/logs.py)."""
    INVOCATION.reset()
    try:
        result = build_app()(args=argv, standalone_mode=False)
        if result == EXIT_KEYBOARD:  # typer turns Ctrl-C into this exit code, silently
            return _fail(KeyboardInterrupt())
        return int(result) if isinstance(result, int) else 0
    except (typer.Exit, click.exceptions.Exit) as exc:
        return int(exc.exit_code)
    except (typer.Abort, click.Abort):
        return _fail(KeyboardInterrupt())
    except (TyperException, click.ClickException) as exc:  # typer's parser: a mistyped command, option or value
        if type(exc).__name__ == "NoArgsIsHelpError":  # `nightscore` (or a group) alone: its help, on stderr
            exc.show()  # type: ignore[union-attr]  # every parser error of typer can show itself
            return EXIT_USAGE
        return _fail(UsageError(f"{exc.format_message()} (see --help)"))
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'parameters'}: {e['msg']}" for e in exc.errors())
        return _fail(UsageError(f"invalid parameters: {problems}"))
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        return _fail(exc)


def _fail(exc: BaseException) -> int:
    """Print a failure's one line (the traceback of an unexpected one goes to the log file); return its exit code."""
    text = " ".join(str(exc).split())[:500]
    if isinstance(exc, KeyboardInterrupt):
        typer.echo("nightscore: aborted", err=True)
    elif is_expected(exc) or isinstance(exc, NightscoreError):
        typer.echo(f"nightscore: error: {text}", err=True)
        log.debug("failure details", exc_info=exc)
    else:
        if INVOCATION.verbose:  # console and log file
            log.error("unexpected error: %s: %s", type(exc).__name__, text, exc_info=exc)
        logged = INVOCATION.verbose or to_log_file(f"unexpected error: {type(exc).__name__}: {text}", exc)
        where = f" (traceback in {INVOCATION.log_file})" if logged and not INVOCATION.verbose else ""
        typer.echo(f"nightscore: unexpected error: {type(exc).__name__}: {text}{where}", err=True)
    return exit_code_for(exc)


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
