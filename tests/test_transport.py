"""jobs/transport.py: the embedded broker never hands a consumer a partial message, never delivers one message
twice, and never stops a consumer on a bad file (issue 8, item 1)."""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any, Iterator

import kombu
import pytest
from kombu.exceptions import ChannelError
from kombu.exceptions import ConnectionError as BrokerConnectionError
from kombu.transport import virtual

from tests.broker_stress import run, transport_options
from pid.jobs import queue_files as qf
from pid.jobs import transport
from pid.jobs.transport import register

register()


@pytest.fixture(autouse=True)
def fresh_broker_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bindings are remembered per process (as kombu's filesystem transport does): one test's binding of `jobs`
    must not make the next test skip writing its own control folder's table."""
    monkeypatch.setattr(transport.Transport, "global_state", virtual.BrokerState())


@pytest.fixture
def options(tmp_path: Path) -> dict[str, Any]:
    return transport_options(tmp_path)


@pytest.fixture
def conn(options: dict[str, Any]) -> Iterator[kombu.Connection]:
    with kombu.Connection("pidfs://", transport_options=options) as connection:
        yield connection


def queue_files(options: dict[str, Any], suffix: str = ".jobs.msg") -> list[str]:
    return sorted(n for n in os.listdir(options["data_folder_in"]) if n.endswith(suffix))


@pytest.mark.cli   # four real processes passing 10,000 messages: seconds, not the fast tier's milliseconds
def test_two_producers_two_consumers_lose_nothing(tmp_path: Path) -> None:
    """The issue's acceptance: 2 producer x 2 consumer processes, 5,000 messages per producer."""
    result = run(tmp_path, "pidfs://", producers=2, consumers=2, per_producer=5000)
    assert (result.received, result.lost, result.duplicated, result.unreadable) == (10000, 0, 0, 0), result


def test_register_is_idempotent_and_names_the_transport(options: dict[str, Any]) -> None:
    register()
    register()
    assert kombu.transport.TRANSPORT_ALIASES["pidfs"] == "pid.jobs.transport:Transport"
    with kombu.Connection("pidfs://", transport_options=options) as connection:
        assert isinstance(connection.transport, transport.Transport)


def test_message_files_are_readable_by_their_owner_only(conn: kombu.Connection, options: dict[str, Any]) -> None:
    old = os.umask(0)   # a permissive umask must not widen them
    try:
        conn.SimpleQueue("jobs").put({"secret": "token"})
    finally:
        os.umask(old)
    [name] = queue_files(options)
    assert stat.S_IMODE(os.stat(os.path.join(options["data_folder_in"], name)).st_mode) == 0o600


def test_a_half_written_temp_file_is_never_read(conn: kombu.Connection, options: dict[str, Any]) -> None:
    """A producer's file before its rename: a reader neither delivers, moves nor counts it."""
    queue = conn.SimpleQueue("jobs")
    name = "00000000000000000001_0123456789abcdef0123456789abcdef.jobs.msg"
    temp = Path(options["data_folder_in"]) / (qf.TEMP_PREFIX + name + qf.TEMP_SUFFIX)
    temp.write_text('{"body": "half')
    with pytest.raises(queue.Empty):
        queue.get_nowait()
    assert queue.qsize() == 0
    assert temp.read_text() == '{"body": "half'
    assert not (Path(options["data_folder_in"]) / transport.BAD).exists()
    queue.put({"n": 1})
    assert queue.get_nowait().payload == {"n": 1}
    assert temp.exists()


def test_a_message_being_written_is_invisible_until_complete(
        conn: kombu.Connection, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Halfway through a producer's write, another consumer finds nothing; after it, the whole message."""
    queue = conn.SimpleQueue("jobs")
    with kombu.Connection("pidfs://", transport_options=options) as other:
        reader = other.SimpleQueue("jobs")
        seen: list[str] = []
        write_all = qf._write_all

        def write_in_halves(fd: int, data: bytes) -> None:
            write_all(fd, data[:len(data) // 2])
            with pytest.raises(reader.Empty):
                reader.get_nowait()
            seen.append("half")
            write_all(fd, data[len(data) // 2:])

        monkeypatch.setattr(qf, "_write_all", write_in_halves)
        queue.put({"n": 1, "pad": "x" * 10000})
        assert seen == ["half"]
        assert reader.get_nowait().payload == {"n": 1, "pad": "x" * 10000}


def test_a_message_that_cannot_be_read_goes_back_and_the_error_is_recoverable(
        conn: kombu.Connection, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """An error of the system's, not the message's: the message returns to the queue, and the error is one Celery's
    consumer reconnects after (a connection error), not one that stops it."""
    queue = conn.SimpleQueue("jobs")
    queue.put({"n": 1})

    def no_descriptors(*args: Any, **kwargs: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(transport, "open", no_descriptors, raising=False)
    with pytest.raises(BrokerConnectionError):
        queue.get_nowait()
    assert conn.transport.connection_errors and issubclass(BrokerConnectionError, conn.transport.connection_errors)
    monkeypatch.delattr(transport, "open")
    assert queue.qsize() == 1
    assert queue.get_nowait().payload == {"n": 1}


def test_a_garbage_message_is_set_aside_and_the_consumer_goes_on(
        conn: kombu.Connection, options: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    queue = conn.SimpleQueue("jobs")
    folder = Path(options["data_folder_in"])
    garbage = "00000000000000000001_0123456789abcdef0123456789abcdef.jobs.msg"     # sorts first
    empty = "00000000000000000002_0123456789abcdef0123456789abcdef.jobs.msg"
    (folder / garbage).write_bytes(b"\xff{not json")
    (folder / empty).write_bytes(b"")
    queue.put({"n": 1})
    with caplog.at_level(logging.WARNING, logger="pid.worker"):
        message = queue.get_nowait()
    assert message.payload == {"n": 1}
    assert sorted(os.listdir(folder / transport.BAD)) == [garbage, empty]
    assert sum("unreadable message moved aside" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(queue.Empty):
        queue.get_nowait()


def test_a_message_another_consumer_took_is_skipped(options: dict[str, Any]) -> None:
    with kombu.Connection("pidfs://", transport_options=options) as a, \
            kombu.Connection("pidfs://", transport_options=options) as b:
        qa, qb = a.SimpleQueue("jobs"), b.SimpleQueue("jobs")
        for n in range(3):
            qa.put({"n": n})
        assert qa.get_nowait().payload == {"n": 0}        # a's listing still names 1 and 2
        assert qb.get_nowait().payload == {"n": 1}        # b takes 1 from under a
        assert qa.get_nowait().payload == {"n": 2}        # a skips the vanished 1
        with pytest.raises(qb.Empty):
            qb.get_nowait()
        assert os.listdir(Path(options["data_folder_in"]) / transport.CLAIMED) == []


def test_oldest_first_size_and_purge(conn: kombu.Connection, options: dict[str, Any]) -> None:
    queue = conn.SimpleQueue("jobs")
    for n in range(20):
        queue.put({"n": n})
    conn.SimpleQueue("other").put({"n": -1})
    assert queue.qsize() == 20
    assert [queue.get_nowait().payload["n"] for _ in range(10)] == list(range(10))
    assert queue.qsize() == 10
    assert queue.clear() == 10
    assert queue.qsize() == 0
    assert conn.SimpleQueue("other").qsize() == 1


def test_a_message_for_the_front_is_read_before_those_queued_in_their_own_order(conn: kombu.Connection) -> None:
    """A job put back (jobs/dispatch.py) is sent with FRONT_PRIORITY: it goes ahead of the jobs that never ran."""
    queue = conn.SimpleQueue("jobs")
    for n in range(3):
        queue.put({"n": n})
    queue.put({"n": "back-1"}, priority=qf.FRONT_PRIORITY)
    queue.put({"n": 3}, priority=0)
    queue.put({"n": "back-2"}, priority=qf.FRONT_PRIORITY)
    assert [queue.get_nowait().payload["n"] for _ in range(6)] == ["back-1", "back-2", 0, 1, 2, 3]


def test_messages_queued_by_kombus_own_transport_are_still_delivered(
        conn: kombu.Connection, options: dict[str, Any]) -> None:
    """An upgrade keeps the queue: kombu names messages `<ms>_<uuid>.<queue>.msg`, as this transport does."""
    with kombu.Connection("filesystem://", transport_options=options) as old:
        old.SimpleQueue("jobs").put({"n": "old"})
    assert conn.SimpleQueue("jobs").get_nowait().payload == {"n": "old"}


def test_store_processed_keeps_the_message_in_the_processed_folder(tmp_path: Path) -> None:
    options = {**transport_options(tmp_path), "store_processed": True, "processed_folder": str(tmp_path / "done")}
    with kombu.Connection("pidfs://", transport_options=options) as connection:
        queue = connection.SimpleQueue("jobs")
        queue.put({"n": 1})
        assert queue.get_nowait().payload == {"n": 1}
    [kept] = os.listdir(tmp_path / "done")
    assert kept.endswith(".jobs.msg")
    assert os.listdir(Path(options["data_folder_in"]) / transport.CLAIMED) == []


def test_a_message_read_is_delivered_even_if_it_cannot_be_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    options = {**transport_options(tmp_path), "store_processed": True, "processed_folder": str(tmp_path / "done")}

    def disk_full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    with kombu.Connection("pidfs://", transport_options=options) as connection:
        queue = connection.SimpleQueue("jobs")
        queue.put({"n": 1})
        monkeypatch.setattr(transport.shutil, "move", disk_full)
        with caplog.at_level(logging.WARNING, logger="pid.worker"):
            assert queue.get_nowait().payload == {"n": 1}
    assert "was delivered but not kept" in caplog.text


def test_fanout_goes_through_the_atomic_put(conn: kombu.Connection, options: dict[str, Any]) -> None:
    """Celery's control messages (pidbox) are fanout: every bound queue gets a complete, owner-only copy."""
    exchange = kombu.Exchange("control", type="fanout")
    queues = [kombu.Queue(name, exchange).bind(conn.default_channel) for name in ("w1", "w2")]
    old = os.umask(0)
    try:
        for queue in queues:
            queue.declare()
        kombu.Producer(conn.default_channel).publish({"ping": 1}, exchange=exchange, declare=[exchange])
    finally:
        os.umask(old)
    table = Path(options["control_folder"], "control.exchange")
    assert stat.S_IMODE(table.stat().st_mode) == 0o600
    for queue in queues:
        [file] = queue_files(options, f".{queue.name}.msg")
        assert stat.S_IMODE(os.stat(os.path.join(options["data_folder_in"], file)).st_mode) == 0o600
        assert queue.get(no_ack=True).payload == {"ping": 1}
    assert not [n for n in os.listdir(options["data_folder_in"]) if n.startswith(qf.TEMP_PREFIX)
                and n.endswith(qf.TEMP_SUFFIX)]


def test_an_exchange_table_being_created_reads_as_empty(conn: kombu.Connection, options: dict[str, Any]) -> None:
    """A binder creates the table file before it writes it: a reader in between sees no binding, not an error."""
    Path(options["control_folder"], "control.exchange").write_bytes(b"")
    channel = conn.default_channel
    assert channel.get_table("control") == []
    kombu.Queue("w1", kombu.Exchange("control", type="fanout")).bind(channel).declare()
    assert [row.queue for row in channel.get_table("control")] == ["w1"]


def test_a_queue_name_cannot_leave_the_folder(conn: kombu.Connection) -> None:
    with pytest.raises(ChannelError):
        conn.default_channel._put("../escape", {"n": 1})


def test_a_claim_folder_on_another_filesystem_is_refused(tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    claim = other / f"pid-test-claim-{os.getpid()}"
    options = {**transport_options(tmp_path), "claim_folder": str(claim)}
    try:
        with kombu.Connection("pidfs://", transport_options=options) as connection:
            queue = connection.SimpleQueue("jobs")
            queue.put({"n": 1})
            with pytest.raises(ChannelError, match="not on the filesystem"):
                queue.get_nowait()
    finally:
        if claim.is_dir():
            claim.rmdir()


def test_an_html_error_page_is_its_first_meaningful_line():
    from pid.providers.transport import error_text
    hint = " (an HTML page, not an API's answer)"
    assert error_text(b"<!DOCTYPE html>\n<html><head><title>\n  404 Not Found\n</title></head>"
                      b"<body><h1>404 Not Found</h1>" + b"<p>x</p>" * 500 + b"</body></html>") == "404 Not Found" + hint
    assert error_text(b"<html><head><style>p { x: 1 }</style></head><body>\n\n <p>Service &amp; co</p> <p>more</p>"
                      b"</body></html>") == "Service & co" + hint
    assert error_text(b'{"error": {"message": "<b>not html</b>"}}') == "<b>not html</b>"   # JSON: its own words
    assert error_text(b"plain words") == "plain words"
