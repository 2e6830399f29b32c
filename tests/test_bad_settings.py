"""Every bad value of every setting gets the same one-line message from every front (issue 31): the CLI (exit 2),
the estimator (``ValueError``) and the service (HTTP 422).  The bad values are generated from the table
(``scalemb.params.PARAMS``): below and above each bound, a fraction for an integer, a name that is no choice; each
front names the setting its own way (``--space``, ``space``, ``space_dims``) and says the rest identically."""
import pytest

import scalemb
from scalemb.params import PARAMS, estimator_name

from .cli_runner import run_cli


def bad_values(p) -> list:
    """``(value, as the messages show it)`` pairs the row refuses (the command line gets ``str(value)``)."""
    if p.choices is not None:
        return [("bogus", "'bogus'")]
    if p.type is None or p.validate is not None or p.name == "model_params":
        return []
    integer = p.type in (int, int | None)
    out = []
    if "ge" in p.bounds or "gt" in p.bounds:
        low = p.bounds.get("ge", p.bounds.get("gt"))
        out.append(low - 1 if integer else (low / 2 if "ge" in p.bounds and low > 0 else low - 1.0))
    if "le" in p.bounds:
        out.append(p.bounds["le"] + 1 if integer else p.bounds["le"] * 2)
    if "lt" in p.bounds:
        out.append(p.bounds["lt"])
    if integer:
        out.append(1.5)
    return [(v, repr(v)) for v in out]


ROWS = [p for p in PARAMS if p.run and p.cli and bad_values(p)]
CASES = [pytest.param(p, value, text, id=f"{p.name}={text}") for p in ROWS for value, text in bad_values(p)]


def _body(message: str, name: str) -> str:
    """The message after the front's name of the setting."""
    assert message.startswith(f"{name}: "), (name, message)
    return message[len(name) + 2:]


def _cli_message(p, value, tmp_path) -> str:
    proc = run_cli("embed", "school", f"{p.cli}={value}", "--iterations", "2", "--out", tmp_path / "r.zarr", "--quiet")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines and not (tmp_path / "r.zarr").exists(), proc.stderr
    prefix = "scalemb embed: error: argument "
    assert lines[-1].startswith(prefix), lines[-1]
    return _body(lines[-1][len(prefix):], p.cli)


def _estimator_message(p, value) -> str:
    with pytest.raises(ValueError) as refused:
        scalemb.Embedder(**{"max_iter": 2, estimator_name(p): value}).fit("school")
    message = str(refused.value)
    assert "\n" not in message
    return _body(message, estimator_name(p))


def test_every_table_row_has_bad_values():
    assert len(ROWS) >= 20 and all(p.name in {q.name for q in ROWS} for p in PARAMS
                                   if p.run and p.cli and (p.choices is not None or p.bounds))


@pytest.mark.parametrize("p, value, text", CASES)
def test_cli_and_estimator_say_the_same(p, value, text, tmp_path):
    cli = _cli_message(p, value, tmp_path)
    assert cli == _estimator_message(p, value)
    assert cli.startswith("must be ") and cli.endswith(f"got {text}")


@pytest.fixture
def service(shared_service):
    """The session's ``scalemb serve`` (conftest's ``shared_service``) for the two tests below, instead of
    conftest's one per test: they only send settings it refuses (no job is created)."""
    return shared_service


@pytest.mark.slow
def test_the_service_says_it_too(service):
    """The service's 422 detail is ``FIELD: <the same message>`` for each bad value of each row it offers."""
    checked = 0
    for p in (row for row in ROWS if row.service):
        for value, text in bad_values(p):
            status, answer = service.json("POST", "/jobs", {"input": "school", p.service: value})
            assert status == 422, (p.name, value, answer)
            assert _body(answer["detail"], p.service) == _estimator_message(p, value), (p.name, value)
            checked += 1
    assert checked >= 40


# inputs a setting does not fit: (settings, the message after the setting's name(s))
MISFITS = [
    ({"affinity": "knn"}, "'knn' needs a feature matrix (.npy, .csv, .tsv); school is a built-in dataset"),
    ({"affinity": "precomputed"}, "'precomputed' needs an affinity store (P itself); school is a built-in dataset"),
    ({"perplexity": 5.0}, "kNN settings apply to a feature matrix (AFFINITY knn); school is read as a graph"),
]


def _names(settings: dict, front: str) -> str:
    rows = {p.name: p for p in PARAMS}
    return ", ".join(getattr(rows[name], front) if front != "name" else name for name in settings)


@pytest.mark.parametrize("settings, body", MISFITS)
def test_misfit_inputs_read_the_same_on_the_cli_and_the_estimator(settings, body, tmp_path):
    argv = [f"{PARAMS_BY[name].cli}={value}" for name, value in settings.items()]
    proc = run_cli("embed", "school", *argv, "--iterations", "2", "--out", tmp_path / "r.zarr", "--quiet")
    assert proc.returncode == 2 and proc.stderr.strip() == \
        f"scalemb: error: {_names(settings, 'cli')}: {body.replace('AFFINITY', '--affinity')}", proc.stderr
    with pytest.raises(ValueError) as refused:
        scalemb.Embedder(iterations=2, **settings).fit("school")
    assert str(refused.value) == f"{_names(settings, 'name')}: {body.replace('AFFINITY', 'affinity')}"


@pytest.mark.slow
def test_misfit_inputs_read_the_same_on_the_service(service):
    for settings, body in MISFITS:
        status, answer = service.json("POST", "/jobs", {"input": "school", **settings})
        assert status == 422 and answer["detail"] == \
            f"{_names(settings, 'service')}: {body.replace('AFFINITY', 'affinity')}", answer


PARAMS_BY = {p.name: p for p in PARAMS}


DIRECTORY = "is a directory but not an affinity store (a Zarr group written by scalemb affinity)"


def test_a_directory_that_is_no_affinity_store_reads_the_same_on_the_cli_and_the_estimator(tmp_path):
    """``scalemb.run.inputs.input_kind`` refuses it for every front (before: 'not a regular file' from the edge-list
    reader on the CLI and the estimator, the service's own check)."""
    folder = tmp_path / "edges"
    folder.mkdir()
    (folder / "part-0.txt").write_text("1 2\n2 3\n")
    proc = run_cli("embed", folder, "--iterations", "2", "--out", tmp_path / "r.zarr", "--quiet")
    assert proc.returncode == 2 and proc.stderr.strip() == f"scalemb: error: {folder} {DIRECTORY}", proc.stderr
    assert not (tmp_path / "r.zarr").exists()
    with pytest.raises(ValueError) as refused:
        scalemb.Embedder(max_iter=2).fit(str(folder))
    assert str(refused.value) == f"{folder} {DIRECTORY}"


@pytest.mark.slow
def test_a_directory_that_is_no_affinity_store_is_a_422_on_the_service(service):
    (service.root / "edges").mkdir()
    (service.root / "edges" / "part-0.txt").write_text("1 2\n2 3\n")
    snapshots = service.root / "snapshots"  # the session service's: what other tests' jobs copied stays
    before = set(snapshots.iterdir()) if snapshots.exists() else set()
    status, answer = service.json("POST", "/jobs", {"input": "edges"})
    assert status == 422 and answer["detail"] == f"input 'edges' {DIRECTORY}", answer
    assert (set(snapshots.iterdir()) if snapshots.exists() else set()) == before  # refused before any copy
