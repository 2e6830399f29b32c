"""One parameter table (scalemb.params.PARAMS): the estimator's signature is generated from it; the CLI flags
and the service's job fields it names must exist with the same choices and defaults."""
import argparse
import inspect
import typing

import pytest

import scalemb
from scalemb.cli.main import build_parser
from scalemb.methods import method_names
from scalemb.params import ESTIMATOR_DEFAULTS, ESTIMATOR_NAMES, PARAMS

# defaults that differ on purpose, with the reason; the table spells them out (Param.effective)
EFFECTIVE = {
    "random_state": 0,  # None means seed 0: the CLI and the service spell it out
    "quiet": False,  # the library is quiet by default, the CLI shows progress unless --quiet
}


def test_the_table_spells_out_the_effective_defaults():
    assert {p.name: p.outer_default for p in PARAMS if p.outer_default != p.default} == EFFECTIVE


def _embed_actions():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {opt: action for action in sub.choices["embed"]._actions for opt in action.option_strings}


def test_estimators_are_generated_from_the_table():
    for cls, model in ((scalemb.Embedder, "tsne"), (scalemb.SNE, "sne"), (scalemb.TSNE, "tsne"),
                       (scalemb.SNEST, "snest"), (scalemb.CoSNE, "cosne"), (scalemb.ElasticEmbedding, "ee")):
        params = inspect.signature(cls.__init__).parameters
        assert [n for n in params if n != "self"] == list(ESTIMATOR_NAMES)
        assert cls().get_params() == dict(ESTIMATOR_DEFAULTS, model=model)
        # scikit-learn's names are the estimator's; the run fields' names are deprecated aliases (default None)
        assert {"n_components", "max_iter", "early_exaggeration", "verbose", "random_state", "n_jobs"} <= set(params)
        assert all(cls().get_params()[old] is None for old in ("space_dims", "iterations", "exaggeration", "quiet"))


def test_cli_flags_agree_with_the_table():
    actions = _embed_actions()
    for p in PARAMS:
        if p.cli is None:
            continue
        assert p.cli in actions, f"{p.name}: no {p.cli} flag"
        action = actions[p.cli]
        default = EFFECTIVE.get(p.name, p.default)
        if p.name == "quiet":
            assert action.default is False
            continue
        if not isinstance(p.default, str) or p.name != "optimizer":
            assert action.default == default, (p.name, action.default, default)
        assert action.help == f"{p.help} (default {p.outer_default})", p.name  # generated from the row
        if p.choices is not None:
            # the CLI's --model also names the registered methods (scalemb.methods: the eigenmaps)
            extra = method_names() if p.name == "model" else ()
            assert [action.type(c) for c in tuple(p.choices) + tuple(extra)] == list(p.choices) + list(extra)
            with pytest.raises(argparse.ArgumentTypeError, match="must be one of"):
                action.type("bogus")


def test_service_fields_agree_with_the_table():
    pytest.importorskip("fastapi")
    from scalemb.service.requests import JobRequest

    fields = JobRequest.model_fields
    for p in PARAMS:
        if p.service is None:
            continue
        assert p.service in fields, f"{p.name}: no service field {p.service}"
        field = fields[p.service]
        assert field.default == EFFECTIVE.get(p.name, p.default), p.name
        assert field.description == p.help, p.name
        if isinstance(p.choices, tuple):
            assert typing.get_args(field.annotation) == p.choices, p.name
        bounds = {name: getattr(m, name) for m in field.metadata for name in ("ge", "gt", "le", "lt")
                  if hasattr(m, name)}
        assert bounds == p.bounds, p.name
    # the service-only fields are the only ones not in the table
    assert set(fields) - {p.service for p in PARAMS} == {"input"}
    # the kNN settings the estimator takes are job fields (the service embeds feature uploads)
    for name in ("affinity", "perplexity", "n_neighbors", "metric"):
        assert next(p for p in PARAMS if p.name == name).service == name
