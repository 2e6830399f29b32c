"""The package's names are imported on first use (``scalemb.lazy``): a process that imports ``scalemb`` -- the
CLI, a Dask worker unpickling a task -- does not pay for scikit-learn, pandas, zarr or dask unless it uses them, and
every public name still resolves, from the package and from its lazy subpackages."""
import json
import subprocess
import sys

import pytest

import scalemb

HEAVY = ("sklearn", "pandas", "scipy.stats", "zarr", "dask", "distributed", "numba", "matplotlib")


def _loaded_after(code: str) -> set:
    """The modules of ``HEAVY`` a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_importing_the_package_loads_none_of_the_heavy_libraries():
    assert _loaded_after("import scalemb; scalemb.__version__") == set()


def test_a_worker_task_module_does_not_load_the_estimators_or_the_ingestion():
    """What a Dask worker imports to run the held optimiser's tasks: numba and the FFT, not scikit-learn (the
    estimators), pandas, zarr (the stores) or the kNN search."""
    loaded = _loaded_after("import scalemb.engine.held_tasks")
    assert "numba" in loaded
    assert not loaded & {"sklearn", "pandas", "scipy.stats", "zarr", "matplotlib"}, loaded


def test_the_command_lines_version_does_not_load_scikit_learn():
    loaded = _loaded_after("import sys\nfrom scalemb.cli.main import main\nsys.argv = ['scalemb', '--version']\n"
                           "try:\n    main()\nexcept SystemExit:\n    pass")
    assert not loaded & {"sklearn", "pandas", "scipy.stats"}, loaded


@pytest.mark.parametrize("package", ["scalemb", "scalemb.affinity", "scalemb.eigenmaps", "scalemb.engine"])
def test_every_public_name_resolves_and_is_listed(package):
    module = __import__(package, fromlist=["_"])
    for name in module.__all__:
        assert getattr(module, name) is not None, name
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name


def test_names_are_the_defining_modules_objects_and_resume_is_the_function():
    from scalemb.estimator import TSNE
    from scalemb.run import resume as resume_module

    assert scalemb.TSNE is TSNE
    assert scalemb.resume is resume_module.resume and callable(scalemb.resume)
    assert scalemb.tl.__name__ == "scalemb.tl"
    namespace = {}
    exec("from scalemb import *", namespace)  # noqa: S102 - the star import users write in notebooks
    assert set(scalemb.__all__) <= set(namespace)


def test_subpackages_and_submodules_are_reached_as_attributes_after_a_bare_import():
    """``import scalemb`` then ``scalemb.affinity.knn_affinity`` or ``scalemb.engine.local.LocalExecutor``, as when
    the package imported everything; a name that is neither a public name nor a submodule stays an error."""
    code = ("import scalemb\n"
            "assert callable(scalemb.affinity.knn_affinity)\n"
            "assert scalemb.engine.local.LocalExecutor.__name__ == 'LocalExecutor'\n"
            "assert scalemb.eigenmaps.kernel.KernelEigenmap is scalemb.KernelEigenmap\n"
            "assert scalemb.models.get_model('tsne') is not None\n"
            "try:\n    scalemb.affinity.not_a_module\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)")
    subprocess.run([sys.executable, "-c", code], check=True)
