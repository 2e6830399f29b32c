"""Tasks sent to the Dask scheduler as one graph (``TaskGraph``): what ``DaskExecutor._one_graph`` collects.

Why: a client's messages to the scheduler go through a batched stream that sends the first message at once and
then at most one batch per 10 ms (``distributed.client``'s ``BatchedSend(interval="10ms")``, not configurable),
and the scheduler handles each ``client.submit`` as a graph of its own (deserialised, ordered and materialised off
its event loop, two thread hand-offs each).  An evaluation on the workers is ~a dozen tasks submitted in a burst:
one at a time, all but the first waited for the stream's next batch and each cost the scheduler a graph update.
Collected here and sent as one graph, they leave in one message, at once, and cost one update.

The tasks keep what ``client.submit`` gives them: their keys, worker restrictions, loose restrictions and
priorities, here as per-key annotations (Dask's layer annotations), and the client's futures for them, created
when the task is added (``Future(key, client)``, which ``client.submit`` itself returns for a key the client
knows) so that later tasks of the same graph can take them as inputs.  The futures are valid once the graph is
sent (``send``); a graph never sent (an error while it was built) leaves only local references behind.
"""
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

_OPTIONS = ("workers", "allow_other_workers", "priority")


class TaskGraph:
    """Tasks added one by one (``add``: a ``client.submit`` call's arguments, a future back), sent as one
    graph (``send``)."""

    def __init__(self, client):
        self.client = client
        self.tasks = []  # (key, Task, annotations)

    def add(self, key: str, fn, args: tuple, options: dict):
        """The task ``fn(*args)`` under ``key`` with ``client.submit``'s ``options`` (``workers``,
        ``allow_other_workers``, ``priority``); its future (computed once the graph is sent)."""
        from dask._task_spec import Task, parse_input
        from distributed import Future

        unknown = set(options) - set(_OPTIONS)
        if unknown:
            raise TypeError(f"options {sorted(unknown)} are not supported in a graph (only {', '.join(_OPTIONS)})")
        annotations = {}
        if options.get("workers"):
            annotations["workers"] = list(options["workers"])
            annotations["allow_other_workers"] = bool(options.get("allow_other_workers"))
        if options.get("priority"):
            annotations["priority"] = options["priority"]
        self.tasks.append((key, Task(key, fn, *(parse_input(a) for a in args)), annotations))
        return Future(key, self.client)

    def send(self) -> None:
        """Send the tasks added since the last ``send`` as one graph (nothing if none); the client's batched
        stream takes it as one message."""
        if not self.tasks:
            return
        tasks, self.tasks = self.tasks, []
        groups = {}  # one layer per set of annotations: Dask applies a layer's annotations to each of its keys
        for key, task, annotations in tasks:
            group = tuple(sorted((name, tuple(v) if isinstance(v, list) else v) for name, v in annotations.items()))
            groups.setdefault(group, ({}, annotations))[0][key] = task
        layers = {f"scalemb-graph-{i}": MaterializedLayer(mapping, annotations=annotations or None)
                  for i, (mapping, annotations) in enumerate(groups.values())}
        graph = HighLevelGraph(layers, {name: set() for name in layers})
        # ``fifo_timeout`` as ``client.submit``'s: graphs sent within 100 ms share a priority generation
        self.client.get(graph, [key for key, _, _ in tasks], sync=False, fifo_timeout="100ms")
