"""pid/settings.py is the one place a PID_* variable is named in the code, and docs/options.md lists every one."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pid import settings
from pid.errors import PidError

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"PID_[A-Z0-9_]+")
# Not settings of pid: the variable that carries the image's environment inside the container (sandbox/image_env.py).
NOT_SETTINGS = {"PID_IMAGE_ENV"}


def named_variables(source: str, where: str) -> list[str]:
    """Each string constant in `source` that is a PID_* name and nothing else: what a read or an envvar= names
    (a message or docstring that mentions one is not a read)."""
    return [f"{where}:{node.lineno}: {node.value}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)
            and node.value not in NOT_SETTINGS]


def test_only_the_settings_module_names_a_variable() -> None:
    found = [hit for package in ("pid", "sandbox", "jobs", "worker", "cli")
             for path in sorted((ROOT / package).rglob("*.py"))
             if path != ROOT / "pid" / "settings.py"
             for hit in named_variables(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "read these through pid/settings.py:\n" + "\n".join(found)


def test_the_guard_sees_a_read_not_a_mention() -> None:
    source = ('"""Set PID_X_S to sweep sooner."""\nimport os\nX = float(os.environ.get("PID_X_S", "5"))\n'
              'OPTION = dict(envvar="PID_Y")\nMESSAGE = f"PID_Y={X}: not a number"\n')
    assert named_variables(source, "m.py") == ["m.py:3: PID_X_S", "m.py:4: PID_Y"]


def test_each_setting_is_declared_once() -> None:
    names = [s.name for s in settings.ALL]
    assert len(names) == len(set(names)) and all(NAME.fullmatch(n) for n in names)
    assert all(s.why for s in settings.ALL)


def test_the_docs_table_is_current() -> None:
    doc = (ROOT / "docs" / "options.md").read_text()
    assert settings.table() in doc, "regenerate docs/options.md's table: python -c " \
        "'import pid.settings as s; print(s.table(), end=\"\")'"


def test_a_setting_is_read_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.SWEEP_S.name, raising=False)
    assert settings.SWEEP_S.get() == 5.0 and settings.SWEEP_S.raw() is None
    monkeypatch.setenv(settings.SWEEP_S.name, "1.5")
    assert settings.SWEEP_S.get() == 1.5
    monkeypatch.setenv(settings.SWEEP_S.name, "")   # empty is unset
    assert settings.SWEEP_S.get() == 5.0
    monkeypatch.setenv(settings.MAX_ATTEMPTS.name, "x")
    with pytest.raises(ValueError):
        settings.MAX_ATTEMPTS.get()
    monkeypatch.setenv(settings.TIKTOKEN_DOWNLOAD.name, "1")
    assert settings.TIKTOKEN_DOWNLOAD.get() is True
    monkeypatch.setenv(settings.TEST_RUN.name, "  ")
    assert settings.TEST_RUN.get() == ""


@pytest.mark.parametrize("setting, text, why", [
    (settings.LEASE_S, "abc", "$PID_LEASE_S: 'abc' is not a number of seconds above 0 to 604800 (a week)"),
    (settings.LEASE_S, "1e10", "$PID_LEASE_S: '1e10' is not a number of seconds above 0"),
    (settings.LEASE_S, "-1", "$PID_LEASE_S: '-1' is not a number of seconds above 0"),
    (settings.SWEEP_S, "0", "$PID_SWEEP_S: '0' is not a number of seconds above 0"),
    (settings.SWEEP_S, "inf", "$PID_SWEEP_S: 'inf' is not a number of seconds above 0"),
    (settings.RECONCILE_S, "nan", "$PID_RECONCILE_S: 'nan' is not a number of seconds above 0"),
    (settings.NO_WORKER_NOTICE_S, "-0.5", "$PID_NO_WORKER_NOTICE_S: '-0.5' is not a number of seconds from 0"),
    (settings.MAX_ATTEMPTS, "0", "$PID_MAX_ATTEMPTS: '0' is not a whole number from 1"),
    (settings.MAX_ATTEMPTS, "2.5", "$PID_MAX_ATTEMPTS: '2.5' is not a whole number from 1"),
])
def test_a_setting_it_cannot_be_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, setting, text: str,
                                                       why: str) -> None:
    """A bad number crashed `pid` with a traceback (read as a module loaded), or left a worker that took jobs with no
    heartbeat nor sweeps (a new user's test): each is refused, in one line that names the variable, by check() (which
    every command runs first) as by a read."""
    monkeypatch.setenv(setting.name, text)
    for read in (setting.get, settings.check):
        with pytest.raises(settings.BadSetting) as raised:
            read()
        assert str(raised.value).startswith(why) and "\n" not in str(raised.value), raised.value
    assert isinstance(raised.value, PidError)


def test_a_bad_pid_pool_is_the_worker_s_to_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pid worker --pool` parses it (a --pool given wins over it), and no other command reads it: check() leaves it
    to them."""
    monkeypatch.setenv(settings.POOL.name, "many")
    settings.check()
    with pytest.raises(settings.BadSetting, match=r"^\$PID_POOL: takes a whole number of ready sandboxes from 0 "):
        settings.POOL.get()


def test_the_numbers_settings_take() -> None:
    assert (settings.NO_WORKER_NOTICE_S.parse("0"), settings.LEASE_S.parse("0.5"), settings.MAX_ATTEMPTS.parse("1"),
            settings.MAX_ATTEMPTS.parse(" 12 ")) == (0.0, 0.5, 1, 12)


@pytest.mark.parametrize("text,why", [
    ("-1", "from 0 to 64"), ("65", "from 0 to 64"), ("1000000", "from 0 to 64"), ("2.5", "from 0 to 64"),
    ("many", "from 0 to 64"), ("1e3", "from 0 to 64"), ("=3", "IMAGE=N"), ("x=", "IMAGE=N"), ("x=-1", "IMAGE=N"),
    ("\u0663", "from 0 to 64"), ("1,2", "shared size twice"), ("x=1,x:latest=2", "image 'x:latest' twice"),
    ("4,a=30,b=31", "65 ready sandboxes in all"), ("a=b=3", "IMAGE=N"),
])
def test_a_warm_pool_size_out_of_bounds_is_refused(monkeypatch: pytest.MonkeyPatch, text: str, why: str) -> None:
    monkeypatch.setenv(settings.POOL.name, text)
    with pytest.raises(ValueError, match=re.escape(why)):
        settings.POOL.get()


def test_a_warm_pool_size_is_whole_numbers_in_all_and_per_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.POOL.name, raising=False)
    assert settings.POOL.get().total == 0
    for text, shared, per_image in (("0", 0, ()), ("3", 3, ()), ("64", 64, ()),
                                    ("swe/task=8, 2", 2, (("swe/task:latest", 8),)),
                                    ("reg:5000/x:1=2,y@sha256:ab=1", 0, (("reg:5000/x:1", 2), ("y@sha256:ab", 1)))):
        monkeypatch.setenv(settings.POOL.name, text)
        sizes = settings.POOL.get()
        assert (sizes.shared, sizes.per_image) == (shared, per_image)
        assert settings.parse_pool(str(sizes)) == sizes   # (the CLI hands the worker this text)
    sizes = settings.parse_pool("2,swe/task=8")
    assert sizes.budget("swe/task") == sizes.budget("swe/task:latest") == ("swe/task:latest", 8)
    assert sizes.budget("other:1") == ("", 2) and sizes.total == 10


def test_the_settings_module_is_core() -> None:
    """Every package reads its settings here, so this module imports only the standard library."""
    tree = ast.parse((ROOT / "pid" / "settings.py").read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | \
        {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules <= {"__future__", "math", "os", "re", "dataclasses", "typing",
                       "pid.errors"}   # (which imports nothing)
