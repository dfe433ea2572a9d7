"""harness/trainer_status.py: nothing is sent outside a TrainJob, and a report that fails never fails
the case (what it sends is checked end to end in tests/k8s/test_kinds.py)."""

import socket

from harness import trainer_status


def test_nothing_is_sent_without_trainers_three_variables(monkeypatch):
    for name in (trainer_status.URL, trainer_status.CA, trainer_status.TOKEN):
        monkeypatch.delenv(name, raising=False)
    assert trainer_status.report(0) is False


def test_an_endpoint_that_refuses_is_printed_and_not_raised(monkeypatch, tmp_path, capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "token").write_text("t\n")
    monkeypatch.setenv(trainer_status.URL, f"http://127.0.0.1:{port}/status")
    monkeypatch.setenv(trainer_status.CA, str(tmp_path / "token"))
    monkeypatch.setenv(trainer_status.TOKEN, str(tmp_path / "token"))
    assert trainer_status.report(100, {"tokens_per_s": 1.0}) is False
    assert "TrainJob progress not reported (100%): " in capsys.readouterr().err
    monkeypatch.setenv(trainer_status.TOKEN, str(tmp_path / "missing"))
    assert trainer_status.report(0) is False  # an unreadable token file as well
