"""Which nodes of an ONNX Runtime static (QDQ) int8 graph break its outputs, found by measuring each one.

A QDQ graph computes in fp32 between ``DequantizeLinear`` nodes: a quantized node reads
``DQ(Q(x))`` where the fp32 graph reads ``x`` (an activation) and ``DQ(W_int8)`` where it
reads ``W`` (a weight). Node names survive quantization, so each quantized node is found
by comparing its inputs with the fp32 graph's node of the same name, and two edits of the
graph measure it without quantizing again:

* :func:`local_errors`: the node's own error. One graph, the fp32 one, holds beside every
  quantized node a copy fed the int8 inputs; one pass over the rows gives, for each node,
  the RMS of (copy - node) over the RMS of the node's output: the node alone quantized.
* :func:`keep_fp32`: the int8 graph with some nodes fed their fp32 inputs again (as
  ``nodes_to_exclude`` would leave them); :func:`output_error` scores a graph's outputs
  against the fp32 ones (relative squared error per row, averaged).

:func:`search` ranks the nodes by their own error, measures the int8 graph's output error
with each of the worst kept fp32, and keeps fp32 every node that alone accounts for at
least ``SHARE`` of the remaining error (and ``EVEN`` times an even share, so that a small
graph's uniform rounding noise picks nothing), in rounds (an excluded node changes the
others' shares) while the error is above ``TOLERANCE`` and some node qualifies. :func:`fp32_consumers` undoes a side effect of the quantizer: a
tensor quantized for one consumer is read through its ``DequantizeLinear`` by all of them
(a residual ``Add`` reading a LayerNorm output quantized for the next MatMul).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
SHARE = 0.1  # a node that alone causes this fraction of the int8 graph's output error is kept fp32 ...
EVEN = 3.0  # ... and this many times an even share (1 / quantized nodes): a few nodes share any error unevenly
TOLERANCE = 1e-3  # an output error (relative squared) at or below this breaks nothing: the search stops (RMS ~3%)
CANDIDATES = 8  # nodes per round whose exclusion is measured on the whole graph: the worst by their own error
ROUNDS = 3  # rounds of the search (each re-measures the nodes left)
MAX_EXCLUDED = 0.25  # at most this fraction of the quantized nodes is kept fp32: beyond it the graph is not int8
SEARCH_ROWS = 32  # calibration rows the search measures on (each at its own length)


def name_nodes(model) -> None:
    """Give every unnamed node of ``model`` (an ONNX ModelProto, in place) a unique name: nodes are matched by name."""
    taken = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


@dataclass
class Graphs:
    """An fp32 graph and its QDQ int8 graph (ONNX ModelProtos), indexed for the edits below."""

    fp32: Any
    qdq: Any

    def __post_init__(self):
        self.fp32_nodes = {n.name: n for n in self.fp32.graph.node}
        self.fp32_weights = {t.name: t for t in self.fp32.graph.initializer}
        self.producers = {out: n for n in self.qdq.graph.node for out in n.output}
        self.qdq_weights = {t.name: t for t in self.qdq.graph.initializer}
        self.qdq_nodes = {n.name: n for n in self.qdq.graph.node}

    def quantized(self) -> list[str]:
        """The nodes (in graph order) that read an input through a DequantizeLinear the fp32 graph does not have."""
        return [n.name for n in self.qdq.graph.node if n.op_type not in QDQ_OPS and n.name in self.fp32_nodes
                and list(n.input) != list(self.fp32_nodes[n.name].input)]

    def op_type(self, name: str) -> str:
        return self.fp32_nodes[name].op_type

    def int8_input(self, graph, fp32_name: str, qdq_name: str, tag: str) -> str | None:
        """Append to ``graph`` the Q/DQ (a weight: the DQ) that turns ``fp32_name`` into what the int8 graph reads as
        ``qdq_name``; the dequantized tensor's name, or None when ``qdq_name`` is no DQ of it."""
        dq = self.producers.get(qdq_name)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        q = self.producers.get(dq.input[0])
        added = []
        if q is not None and q.op_type == "QuantizeLinear":  # an activation: quantized in the graph
            if q.input[0] != fp32_name:
                return None
            q = _renamed(q, f"{tag}/Q", {0: fp32_name}, f"{tag}/q")
            added.append(q)
            dq = _renamed(dq, f"{tag}/DQ", {0: q.output[0]}, f"{tag}/dq")
        else:  # a weight: its int8 initializer
            dq = _renamed(dq, f"{tag}/DQ", {}, f"{tag}/dq")
        added.append(dq)
        have = {t.name for t in graph.initializer}
        for node in added:
            for name in node.input:
                if name in self.qdq_weights and name not in have:
                    graph.initializer.append(self.qdq_weights[name])
                    have.add(name)
        graph.node.extend(added)
        return dq.output[0]


def _renamed(node, name: str, inputs: dict[int, str], output: str):
    copied = copy.deepcopy(node)
    copied.name = name
    for index, value in inputs.items():
        copied.input[index] = value
    copied.output[0] = output
    return copied


def keep_fp32(graphs: Graphs, names) -> Any:
    """The int8 graph with the nodes ``names`` fed their fp32 inputs (fp32 weights added back); dead Q/DQ removed."""
    model = copy.deepcopy(graphs.qdq)
    have = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.name in names:
            for i, (current, original) in enumerate(zip(node.input, graphs.fp32_nodes[node.name].input)):
                if current != original:
                    node.input[i] = original
                    if original in graphs.fp32_weights and original not in have:
                        model.graph.initializer.append(graphs.fp32_weights[original])
                        have.add(original)
    prune_dead(model)
    return model


def fp32_consumers(model, requested: set[str]) -> int:
    """Feed every node of the QDQ ``model`` (in place) that was not asked to be quantized the fp32 activations it read
    before (a Q/DQ pair stays for the nodes that were); how many inputs changed."""
    producers = {out: n for n in model.graph.node for out in n.output}
    changed = 0
    for node in model.graph.node:
        if node.name in requested or node.op_type in QDQ_OPS:
            continue
        for i, name in enumerate(node.input):
            dq = producers.get(name)
            q = producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":  # an activation (a weight's DQ reads an initializer)
                node.input[i] = q.input[0]
                changed += 1
    prune_dead(model)
    return changed


def prune_dead(model) -> None:
    """Remove (in place) the nodes whose outputs nothing reads, then the initializers nothing reads."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        read = {name for n in graph.node for name in n.input} | outputs
        dead = [n for n in graph.node if not any(out in read for out in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {name for n in graph.node for name in n.input} | outputs
    for weight in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(weight)


def session(model):
    """An ONNX Runtime CPU session of the ModelProto ``model``, warnings off (unused initializers after an edit)."""
    # deferred: a heavy import, paid only where it is used
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_rows(model, rows: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of ``model`` on each row (a dict of (1, length) inputs)."""
    sess = session(model)
    names = [i.name for i in sess.get_inputs()]
    return [sess.run(None, {name: row[name] for name in names}) for row in rows]


def output_error(model, rows, reference: list[list[np.ndarray]]) -> float:
    """The mean over rows of ||int8 - fp32||^2 / ||fp32||^2 over all outputs of ``model`` (``reference``: the fp32
    graph's outputs on the same rows)."""
    errors = []
    for got, want in zip(run_rows(model, rows), reference):
        num = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
        den = sum(float(np.sum(np.asarray(w, dtype=np.float64) ** 2)) for w in want)
        errors.append(num / den if den > 0 else 0.0)
    return float(np.mean(errors))


def local_errors(graphs: Graphs, names: list[str], rows) -> dict[str, float]:
    """Each node's own int8 error: the RMS of (its output with int8 inputs - its fp32 output) over the RMS of its fp32
    output, every other node fp32, on ``rows``. Nodes whose first output is not a float tensor are left out."""
    # deferred: a heavy import, paid only where it is used
    import onnx

    model = copy.deepcopy(graphs.fp32)
    graph = model.graph
    inferred = onnx.shape_inference.infer_shapes(graphs.fp32)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *graph.output]}
    pairs, outputs = {}, {o.name for o in graph.output}
    for name in names:
        node, int8 = graphs.fp32_nodes[name], graphs.qdq_nodes[name]
        if types.get(node.output[0]) != onnx.TensorProto.FLOAT:
            continue
        inputs = [graphs.int8_input(graph, a, b, f"{name}/int8/{i}") if a != b else a
                  for i, (a, b) in enumerate(zip(node.input, int8.input))]
        twin = copy.deepcopy(node)
        twin.name = f"{name}/int8"
        del twin.input[:], twin.output[:]
        twin.input.extend(i or a for i, a in zip(inputs, node.input))
        twin.output.extend(f"{out}/int8" for out in node.output)
        graph.node.append(twin)  # after its Q/DQ inputs, appended just before: the graph stays topologically sorted
        for out in (node.output[0], twin.output[0]):
            if out not in outputs:
                graph.output.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
                outputs.add(out)
        pairs[name] = (node.output[0], twin.output[0])
    order = [o.name for o in graph.output]
    sums = {name: [0.0, 0.0] for name in pairs}  # name -> [sum of squared error, sum of squared fp32 output]
    for values in run_rows(model, rows):
        got = dict(zip(order, values))
        for name, (fp32_out, int8_out) in pairs.items():
            want = got[fp32_out].astype(np.float64)
            sums[name][0] += float(np.sum((got[int8_out] - want) ** 2))
            sums[name][1] += float(np.sum(want ** 2))
    return {name: (err / ref) ** 0.5 for name, (err, ref) in sums.items() if ref > 0}


def search(graphs: Graphs, rows, reference) -> dict[str, Any]:
    """The nodes to keep fp32 (see the module docstring) and the measurements that chose them.

    ``rows``: the inputs measured on; ``reference``: the fp32 graph's outputs on them.
    """
    quantized = graphs.quantized()
    limit = int(MAX_EXCLUDED * len(quantized))
    share = max(SHARE, EVEN / max(len(quantized), 1))
    kept, chosen = graphs.qdq, []
    start = error = output_error(kept, rows, reference)
    rounds = []
    for _ in range(ROUNDS):
        if error <= TOLERANCE:
            break
        left = [n for n in quantized if n not in {c["node"] for c in chosen}]
        own = local_errors(Graphs(graphs.fp32, kept), left, rows) if left else {}
        worst = sorted(own, key=own.get, reverse=True)[:CANDIDATES]
        measured = {}
        for name in worst:  # the int8 graph's error with this node (and the ones chosen before) fp32
            measured[name] = output_error(keep_fp32(graphs, {c["node"] for c in chosen} | {name}), rows, reference)
        picked = [n for n in worst if (error - measured[n]) >= share * error][: max(0, limit - len(chosen))]
        rounds.append({"output_error": error, "measured": {n: {"own_error": own[n], "output_error_fp32": measured[n]}
                                                           for n in worst}, "kept_fp32": picked})
        if not picked:
            break
        for name in picked:
            chosen.append({"node": name, "op": graphs.op_type(name), "own_error": own[name], "output_error_before": error,
                           "output_error_fp32": measured[name], "share": (error - measured[name]) / error,
                           "why": _why(own[name], (error - measured[name]) / error)})
        kept = keep_fp32(graphs, {c["node"] for c in chosen})
        error = output_error(kept, rows, reference)
    return {"rows": len(rows), "quantized_nodes": len(quantized), "output_error_all_int8": start,
            "output_error": error, "excluded": chosen, "rounds": rounds,
            "rule": f"while the int8 graph's output error (relative squared, per row) is above {TOLERANCE:g}: a node is "
                    f"kept fp32 when keeping it fp32 alone removes at least {100 * share:.0f}% of that error ({SHARE:.0%}, "
                    f"and {EVEN:g}x an even share); measured on the {CANDIDATES} nodes with the largest own error per "
                    f"round, {ROUNDS} rounds at most, at most {MAX_EXCLUDED:.0%} of the quantized nodes"}


def _why(own: float, share: float) -> str:
    return (f"quantized alone its output is {100 * own:.1f}% (RMS) off fp32; kept fp32 it removes {100 * share:.0f}% "
            "of the int8 graph's output error")
