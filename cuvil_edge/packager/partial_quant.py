"""Partially quantized variants of one quantized model, by graph surgery, for the mixed search.

The mixed-precision search needs a model per question: "only this block in INT8" for each layer
group, then "everything but these groups" for each greedy step. Running ONNX Runtime's quantizer for
each costs seconds of graph rewriting per call (most of the search's time on EfficientNet-Lite0).
Instead, the fully quantized model is quantized once and each variant rewires the nodes that should
stay in float back to the float model's inputs (the same node names: the quantizer keeps them), then
drops the Q/DQ nodes nobody reads any more. A node so rewired computes exactly what it computes in the
float model; a node left alone reads its quantized inputs as before.

The search only ranks and stops on these variants; the model that ships is quantized for real with
the chosen exclusions and scored again before the search accepts it.
"""

from __future__ import annotations

import copy

import onnx

__all__ = ["float_nodes_except", "node_reads", "quantized_nodes", "sort_topologically", "subgraph_node_count",
           "with_float_nodes"]

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def quantized_nodes(quantized: onnx.ModelProto) -> list[str]:
    """Computing nodes of ``quantized`` that read a DequantizeLinear's output: the nodes quantization
    touched (whatever their op type), which the mixed search may return to float, in graph order."""
    dq_out = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [n.name for n in quantized.graph.node
            if n.op_type not in _QDQ and n.name and any(i in dq_out for i in n.input)]


def subgraph_node_count(model: onnx.ModelProto) -> int:
    """Nodes inside If/Loop/Scan bodies (at any depth): ONNX Runtime's QDQ quantizer leaves them float."""
    def count(graph: onnx.GraphProto) -> int:
        total = 0
        for n in graph.node:
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    total += len(g.node) + count(g)
        return total

    return count(model.graph)


def float_nodes_except(quantized: onnx.ModelProto, keep: list[str]) -> set[str]:
    """Every computing node (not Q/DQ) of ``quantized`` outside ``keep``: "quantize only ``keep``"."""
    wanted = set(keep)
    return {n.name for n in quantized.graph.node if n.op_type not in _QDQ and n.name and n.name not in wanted}


def with_float_nodes(quantized: onnx.ModelProto, float_model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """``quantized`` where the nodes named in ``names`` read the float model's inputs (weights, biases and
    activations as the float model has them); Q/DQ nodes left without readers are removed."""
    out = copy.deepcopy(quantized)
    graph = out.graph
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    float_inits = {i.name: i for i in float_model.graph.initializer}
    produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    # Every name already defined (an int32 bias's DequantizeLinear may output the bias's own name).
    present = {i.name for i in graph.initializer} | produced
    added: dict[str, str] = {}
    for node in graph.node:
        src = float_nodes.get(node.name)
        if node.name not in names or src is None or node.op_type != src.op_type or len(src.input) != len(node.input):
            continue
        for i, name in enumerate(src.input):
            if not name:
                continue
            if name in float_inits:
                if name not in added:
                    # The quantized model may hold a tensor of that name with other values (a bias
                    # moved by bias correction): the float node gets its own copy.
                    added[name] = f"{name}__float" if name in present else name
                    init = onnx.TensorProto()
                    init.CopyFrom(float_inits[name])
                    init.name = added[name]
                    graph.initializer.append(init)
                    present.add(added[name])
                node.input[i] = added[name]
            elif name in produced:
                node.input[i] = name
    _bypass_output_qdq(out, names)
    _prune(out)
    return sort_topologically(out)


def _bypass_output_qdq(model: onnx.ModelProto, names: set[str]) -> None:
    """A graph output behind ``Q -> DQ`` of a float node's result takes that result directly."""
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    for out in graph.output:
        dq = producers.get(out.name)
        q = producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        src = producers.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
        if src is None or src.name not in names:
            continue
        raw = q.input[0]
        for node in graph.node:
            if node is dq or node is q:
                continue
            for i, name in enumerate(node.input):
                if name == raw:
                    node.input[i] = out.name
        for j, name in enumerate(src.output):
            if name == raw:
                src.output[j] = out.name
        q.input[0] = ""  # now dead; pruned with its DQ
        dq.output[0] = ""


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Every name ``node`` reads: its inputs and, through If/Loop/Scan bodies, the outer-scope names
    those subgraphs use (a branch reading a tensor of the main graph keeps its producer alive)."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                names |= node_reads(n) - inner
            names |= {o.name for o in g.output} - inner
    return names


def _prune(model: onnx.ModelProto) -> None:
    """Drop nodes none of whose outputs is read (or is a graph output), then unread initializers."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in node_reads(n)} | outputs
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        ids = {id(n) for n in dead}
        keep = [n for n in graph.node if id(n) not in ids]
        del graph.node[:]
        graph.node.extend(keep)
    read = {i for n in graph.node for i in node_reads(n)} | outputs
    inits = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def sort_topologically(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes in an order where each comes after the producers of what it reads.

    ONNX Runtime's ``convert_float_to_float16(keep_io_types=True)`` appends the input Casts at the
    end of the graph: ONNX Runtime sorts on load, but ``onnx.checker`` (and so ``cuvil-edge
    validate``) refuses such a graph. The sort is stable: already ordered graphs are unchanged.
    """
    graph = model.graph
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producers = {o: idx for idx, n in enumerate(graph.node) for o in n.output}
    pending = list(enumerate(graph.node))
    ordered: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for idx, node in pending:
            needs = {r for r in node_reads(node) if r in producers}
            if needs <= known:
                ordered.append(node)
                known.update(node.output)
            else:
                rest.append((idx, node))
        if len(rest) == len(pending):  # a cycle or a name nobody produces: leave the rest as it was
            ordered.extend(n for _, n in rest)
            break
        pending = rest
    if [id(n) for n in ordered] == [id(n) for n in graph.node]:
        return model
    nodes = [onnx.NodeProto() for _ in ordered]
    for dst, src in zip(nodes, ordered, strict=True):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(nodes)
    return model
