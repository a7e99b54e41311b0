"""`pid --help` and each command's help, as a newcomer reads them (no engine, no store: help only)."""
from __future__ import annotations

import click
from click.testing import CliRunner

from pid.cli.main import cli


def all_commands(group: click.Group, ctx: click.Context) -> list[tuple[str, click.Command]]:
    """Every command under `group`, sub-groups included, each by its full name."""
    found: list[tuple[str, click.Command]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        found.append((f"{ctx.command_path} {name}", command))
        if isinstance(command, click.Group):
            found += all_commands(command, click.Context(command, info_name=name, parent=ctx))
    return found


def test_every_option_of_every_command_has_help():
    ctx = click.Context(cli, info_name="pid")
    missing = [f"{path} {'/'.join(param.opts)}"
               for path, command in [("pid", cli), *all_commands(cli, ctx)]
               for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []


def test_top_help_lists_the_commands_that_start_jobs_first():
    out = CliRunner().invoke(cli, ["--help"], terminal_width=100).output
    sections = out.split("\n\n")
    first = next(s for s in sections if s.startswith("Run jobs:"))
    assert [line.split()[0] for line in first.splitlines()[1:]] == ["run", "submit", "worker", "batch"]
    others = next(s for s in sections if s.startswith("Other commands:"))
    names = [line.split()[0] for line in others.splitlines()[1:] if line.startswith("  ") and line[2] != " "]
    assert "continue" in names and "status" in names and not {"run", "submit", "worker", "batch"} & set(names)
    assert out.index("Run jobs:") < out.index("Other commands:")


def test_batch_help_shows_its_own_options_before_the_job_options():
    out = CliRunner().invoke(cli, ["batch", "--help"], terminal_width=100).output
    own, job = out.index("Batch options:"), out.index("Job options")
    assert own < job
    for flag in ("--workers", "--max-total-cost", "--retry-failed", "--detach", "--status DIR", "--wait DIR"):
        assert own < out.index(f"  {flag}") < job, flag
    for flag in ("--model", "--timeout", "--max-turns", "--api-key"):
        assert out.index(f"  {flag}") > job, flag


def test_help_says_which_ids_a_command_takes():
    """A user finds `last`, an id's end and BATCHDIR/ITEM in the help, not only in the README (issue 22)."""
    top = " ".join(CliRunner().invoke(cli, ["--help"], terminal_width=100).output.split())
    assert "last" in top and "BATCHDIR/ITEM" in top and "70a672" in top, top
    status = CliRunner().invoke(cli, ["status", "--help"], terminal_width=100).output
    assert "status [OPTIONS] ID\n" in status, status


def test_a_bad_pool_size_is_one_line_and_exit_2_before_the_worker_starts():
    for bad, why in (("65", "from 0 to 64"), ("2,x=63", "65 ready sandboxes in all"), ("=1", "IMAGE=N")):
        result = CliRunner().invoke(cli, ["worker", "--pool", bad])
        assert result.exit_code == 2
        assert "Invalid value for '--pool'" in result.output and why in result.output
        assert "PID_POOL" not in result.output   # (the option's own words: the user typed --pool)


def test_top_help_says_each_command_whole_and_choices_as_typed():
    """A new user's: the top help cut most commands' summaries mid-phrase ("(Ctrl-C: finish the..."), and `run
    --help` showed NONE|BRIDGE and OPENAI|ANTHROPIC, which were then refused; they are shown as typed, taken in any
    case."""
    top = CliRunner().invoke(cli, ["--help"], terminal_width=80).output
    commands = top[top.index("Run jobs:"):]
    assert "..." not in commands, commands
    run = CliRunner().invoke(cli, ["run", "--help"], terminal_width=100).output
    for shown in ("--network none|bridge", "--api openai|anthropic", "--thinking off|low|medium|high"):
        assert shown in run, run
    from pid.cli.options import Api, Network, Thinking
    assert (Network().convert("NONE", None, None), Api().convert("OpenAI", None, None),
            Thinking().convert("LOW", None, None)) == ("none", "openai-completions", "low")
