"""The model card (``README.md``) of a model directory: what made it, its shape, its scores, how to load it.

Written from the directory's own ``compression.json``, ``config.json`` and
``metrics.json`` (:func:`model_card` is pure: dicts in, Markdown out), so the card never
states more than the directory records. ``compress.core.formats.records`` writes it when a
directory is saved and rewrites it when a result is appended; a README.md the toolkit did
not write (a sentence-transformers model's own card, say) is never replaced.

What a stock loader can read is decided by :func:`stock_loader`: a PyTorch fp32 folder
loads with ``AutoModel*.from_pretrained`` when its config.json expresses its shapes (one
FFN width; all heads, or heads removed and recorded in ``config.pruned_heads`` on
transformers 4.x); otherwise the stock loader refuses it with a size-mismatch error, and
the card says so and names the export.

A sentence-embedding folder's card also names the exact ``SentenceTransformer(...)`` call
that loads it (:func:`sentence_transformers_call`) and, for an ONNX folder, how Text
Embeddings Inference reads it. Each runtime's file is written once, at the folder's root:
sentence-transformers (``backend/load.py``, 5.x and 6.x) looks for ``model_kwargs``'
``file_name`` at the root before its ``onnx/`` / ``openvino/`` subfolder, Text Embeddings
Inference's ONNX Runtime backend opens ``model.onnx`` at the root before ``onnx/model.onnx``,
and Optimum and compress read the root only; so no copy or link is needed.
"""

from __future__ import annotations

import json
from typing import Any

from compress.core.compat import STOCK_PRUNED_HEADS
from compress.core.model.heads import HEADS

MARKER = "<!-- model card written by compress; rewritten when the directory changes -->"

# SentenceTransformer(DIR, backend=..., model_kwargs=...) per folder format: the file at the root (see the module
# docstring). OpenVINO: f32, as compress compiles it; left to itself the CPU plugin runs fp32 layers in bf16 on CPUs
# with bf16 kernels, and the embeddings move to bf16's precision.
ST_BACKENDS = {
    "onnx": {"file_name": "model.onnx"},
    "openvino": {"file_name": "openvino_model.xml", "ov_config": {"INFERENCE_PRECISION_HINT": "f32"}},
}


def sentence_transformers_call(fmt: str) -> str | None:
    """The ``SentenceTransformer(...)`` call that loads a sentence folder of format ``fmt``; None: none does."""
    if fmt in ("torch", "static"):
        return 'SentenceTransformer("DIR")'  # the default (PyTorch) backend; a static folder's StaticEmbedding
    if fmt in ST_BACKENDS:  # JSON: a Python literal as well, with the double quotes the rest of the card uses
        return f'SentenceTransformer("DIR", backend="{fmt}", model_kwargs={json.dumps(ST_BACKENDS[fmt])})'
    return None


def sentence_loading_line(out, fmt: str) -> str | None:
    """What a stage prints after writing sentence folder ``out`` of format ``fmt``: the card's call with its path."""
    call = sentence_transformers_call(fmt)
    return None if call is None else "sentence-transformers loads it: " + call.replace('"DIR"', json.dumps(str(out)))


def written_here(text: str) -> bool:
    """Whether a README.md is a card this module wrote (its marker first, after a metadata block if any)."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        text = text[end + 5 :] if end >= 0 else text
    return text.startswith(MARKER)


def stock_loader(record: dict[str, Any], config: dict[str, Any]) -> tuple[bool, str]:
    """(loads with stock transformers, why) for a directory's records; pure."""
    fmt = record.get("format") or "torch"
    if fmt != "torch":
        return False, {
            "torch-int8-dynamic": "its int8 weights are in model.int8.safetensors (torch.ao dynamic int8), a file no "
                                  "stock loader reads: from_pretrained finds no model.safetensors and refuses",
            "onnx": "it holds an ONNX graph (model.onnx), not PyTorch weights",
            "openvino": "it holds an OpenVINO IR (openvino_model.xml/.bin), not PyTorch weights",
            "ctranslate2": "it holds a CTranslate2 encoder (model.bin) and its head's tensors, not PyTorch weights",
            "inc-pt2e": "it holds a quantized torch.export program (model.pt2), not PyTorch weights",
            "static": "it holds model2vec static token vectors, not an encoder",
        }.get(fmt, f"its format is {fmt}")
    structure = record.get("structure") or {}
    ffn, heads = structure.get("ffn") or [], structure.get("heads") or []
    if len(set(ffn)) > 1:
        return False, f"its FFN widths differ per layer ({ffn}); config.json has one intermediate_size"
    full = config.get("num_attention_heads") or config.get("n_heads")
    if heads and full and any(h != full for h in heads):
        if STOCK_PRUNED_HEADS and config.get("pruned_heads"):
            return True, "transformers 4.x rebuilds the removed heads from config.pruned_heads"
        return False, (f"it keeps {heads} heads per layer of {full}; a stock config cannot express heads removed "
                       "(transformers 5 has no config.pruned_heads), so from_pretrained stops with a size mismatch")
    return True, "config.json expresses every shape"


def model_card(name: str, record: dict[str, Any], config: dict[str, Any], results: list[dict[str, Any]],
               head: str = "base", sentence: bool = False) -> str:
    """The Markdown card of a directory called ``name`` whose model has ``head``; ``sentence``: a sentence-transformers folder."""
    fmt = record.get("format") or "torch"
    stage, method = record.get("stage", "?"), record.get("method", "?")
    parent = (record.get("parent") or {}).get("path")  # (records.parent_path: this module stays below records)
    lines = [MARKER, "", f"# {name}", ""]
    if fmt == "static":  # model2vec reads a card's metadata block when it loads the folder (and warns without one)
        lines = ["---", "library_name: model2vec", "tags: [embeddings, static-embeddings, sentence-transformers]", "---",
                 *lines]
    made = f"Produced by `compress {stage}` ({method})"
    if parent:
        made += f" from `{parent}`"
    when = (record.get("provenance") or {}).get("date")
    lines.append(made + (f" on {when}." if when else "."))
    precision = record.get("precision") or ("int8" if fmt in ("torch-int8-dynamic", "inc-pt2e") else "fp32")
    lines.append(f"Format: {fmt}, {precision}" + (f" ({record['backend']} {record.get('scheme', '')})".rstrip() + ")"
                                                    if record.get("backend") and precision == "int8" else "") + ".")
    lines += _task_lines(record.get("task_spec"))
    lines += ["", "## Structure", ""]
    lines += _structure_lines(record.get("structure") or {}, config)
    lines += ["", "## Measured", ""]
    lines += _metric_lines(results) or ["Nothing measured yet (`compress eval --model DIR ...` appends here)."]
    lines += ["", "## Loading", ""]
    lines += _loading_lines(name, fmt, head, record, config, sentence)
    return "\n".join(lines) + "\n"


def _task_lines(spec: dict[str, Any] | None) -> list[str]:
    """The user's own task the model was made for (compression.json's "task_spec"): kind, labels, columns."""
    if not isinstance(spec, dict):
        return []
    labels = [str(x) for x in spec.get("labels") or []]
    shown = ", ".join(labels[:12]) + (f", ... ({len(labels)} in all)" if len(labels) > 12 else "")
    lines = ["", "## Task", "", f"- {spec.get('name')}: {spec.get('kind')}, scored by {spec.get('metric')}"]
    if labels:
        lines.append(f"- labels in output order (config.json id2label): {shown}")
    columns = spec.get("columns") or {}
    if columns:
        lines.append("- read from the columns " + ", ".join(f"{field} <- `{col}`" for field, col in columns.items()))
    if spec.get("threshold") is not None:
        lines.append(f"- a label is predicted when its sigmoid is at least {spec['threshold']:g}")
    return lines


def _structure_lines(structure: dict[str, Any], config: dict[str, Any]) -> list[str]:
    if structure.get("static"):
        return [f"- static token vectors (model2vec): {structure.get('vocabulary')} tokens x {structure.get('hidden_size')}, "
                "no layers; a sentence is the mean of its tokens' vectors"]
    if not structure:
        return [f"- {config.get('model_type', '?')}, {config.get('num_hidden_layers', '?')} layers, "
                f"hidden {config.get('hidden_size', '?')}"]
    lines = [f"- {config.get('model_type', '?')}: {structure.get('num_layers')} layers, hidden {structure.get('hidden_size')}, "
             f"head size {structure.get('head_size')}"]
    if structure.get("heads"):
        lines.append(f"- attention heads per layer: {structure['heads']}")
    if structure.get("ffn"):
        lines.append(f"- FFN width per layer: {structure['ffn']}")
    if structure.get("kept_layers") and structure["kept_layers"] != list(range(len(structure["kept_layers"]))):
        lines.append(f"- layers kept from the parent: {structure['kept_layers']}")
    return lines


def _metric_lines(results: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in results:
        metrics = r.get("metrics")
        if not isinstance(metrics, dict) or not metrics:
            continue
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float)))
        where = " ".join(str(x) for x in (r.get("task"), r.get("split")) if x)
        extra = f", n={r['n']}" if r.get("n") else ""
        rows.append(f"| {r.get('kind', '?')} | {where} | {shown}{extra} |")
    if not rows:
        return []
    return ["| kind | task / split | metrics |", "|---|---|---|", *rows]


def _loading_lines(name: str, fmt: str, head: str, record: dict[str, Any], config: dict[str, Any], sentence: bool) -> list[str]:
    ok, why = stock_loader(record, config)
    stock = HEADS.get(head)  # its stock class and pipeline (a head this toolkit does not know: the bare AutoModel)
    auto = stock.auto_class if stock else "AutoModel"
    lines = ["With compress (every format): `compress eval --model DIR ...`, or in Python "
             "`compress.core.formats.runtime.load_model(\"DIR\")`.", ""]
    if fmt == "torch" and ok:
        lines.append(f"Without it: `transformers.{auto}.from_pretrained(\"DIR\")` reproduces these outputs ({why}).")
        if stock and stock.pipeline:
            lines.append(f"As a pipeline: `transformers.pipeline({stock.pipeline}, model=\"DIR\")` names the labels as "
                         "config.json's id2label does.")
    elif fmt == "torch":
        lines.append(f"Stock transformers refuses this folder: {why}. To run it without compress: "
                     "`compress export --model DIR --format onnx --out DIR-onnx` (or `--format openvino`).")
    elif fmt == "torch-int8-dynamic":
        lines.append(f"Stock transformers refuses this folder: {why}. A deployable int8 model: "
                     "`compress quantize --backend onnxruntime` (or `openvino`) from the fp32 parent.")
    elif fmt == "onnx":
        cls = "ORTModelFor" + auto.removeprefix("AutoModelFor") if auto != "AutoModel" else "ORTModelForFeatureExtraction"
        lines.append(f"Without it: `onnxruntime.InferenceSession(\"DIR/model.onnx\")` (inputs "
                     f"{', '.join((record.get('config') or {}).get('inputs') or ['input_ids', 'attention_mask'])}), "
                     f"or Optimum's `{cls}.from_pretrained(\"DIR\")`. Stock transformers refuses it ({why}).")
    elif fmt == "openvino":
        lines.append("Without it: `openvino.Core().compile_model(\"DIR/openvino_model.xml\", \"CPU\")`. "
                     f"Stock transformers refuses it ({why}).")
    elif fmt == "ctranslate2":
        lines += ctranslate2_lines(record, head, sentence) + [f"Stock transformers refuses it ({why})."]
    elif fmt == "static":
        lines.append("Without it: `model2vec.StaticModel.from_pretrained(\"DIR\")` or "
                     "`sentence_transformers.SentenceTransformer(\"DIR\")` (its StaticEmbedding module) give the same "
                     f"normalised embeddings. Stock transformers refuses it ({why}).")
    elif fmt == "inc-pt2e":
        lines.append("Without it: `torch.export.load(\"DIR/model.pt2\").module()` (fast only under `torch.compile` with "
                     f"inductor freezing). Stock transformers refuses it ({why}).")
    if sentence and (fmt != "torch" or ok):
        lines += _sentence_lines(fmt, config)
    return lines


# A head layer's activation as NumPy code on ``x`` (the names compress.core.model.families' HeadLayers use).
NUMPY_ACTIVATIONS = {"tanh": "np.tanh(x)", "relu": "np.maximum(x, 0)"}
# What a head reads, as NumPy code on the Encoder's output ``out`` (HeadLayers.reads).
NUMPY_READS = {
    "pooler_output": "x = np.array(out.pooler_output)  # (batch, hidden): the pooler's tanh over the first token",
    "first_token": "x = np.array(out.last_hidden_state)[:, 0]  # (batch, hidden): the first token's state",
    "tokens": "x = np.array(out.last_hidden_state)  # (batch, longest, hidden); rows past a sentence's end are padding",
}


def ctranslate2_lines(record: dict[str, Any], head: str, sentence: bool) -> list[str]:
    """How plain Python runs a CTranslate2 folder: its Encoder on token ids, then the head the record names in NumPy."""
    spec = record.get("ctranslate2") if isinstance(record.get("ctranslate2"), dict) else {}
    types = ', token_type_ids=batch.get("token_type_ids")' if spec.get("token_type_ids") else ""
    code = ["import ctranslate2, numpy as np", "from safetensors.numpy import load_file",
            "from transformers import AutoTokenizer", "",
            'tokenizer = AutoTokenizer.from_pretrained("DIR")',
            f'encoder = ctranslate2.Encoder("DIR")  # {spec.get("quantization", "?")} weights, run in the stored type '
            'where the CPU has its kernels',
            'batch = tokenizer(["a first sentence", "and a second, longer one"])  # ragged lists: no padding needed',
            f'out = encoder.forward_batch(batch["input_ids"]{types})']
    layout = spec.get("head") if isinstance(spec.get("head"), dict) else None
    if layout is None:
        code.append(NUMPY_READS["tokens"].replace("x = ", "hidden = ", 1))
    else:
        code += [NUMPY_READS.get(layout.get("reads"), "x = ?"), 'head = load_file("DIR/head.safetensors")']
        for name, activation in layout.get("linears") or []:
            code.append(f'x = x @ head["{name}.weight"].T + head["{name}.bias"]')
            if activation:
                code.append(f"x = {NUMPY_ACTIVATIONS.get(activation, activation + '(x)')}")
        outputs = (HEADS[head].outputs if head in HEADS else ("logits",))
        code.append(f"{outputs[0]} = x" if len(outputs) == 1 else
                    f"{', '.join(outputs)} = " + ", ".join(f"x[..., {i}]" for i in range(len(outputs))))
    lines = ["Without it: CTranslate2 runs the encoder (`model.bin`, returning the last hidden state and the pooler "
             "output) and NumPy the task head on its outputs (`head.safetensors`), as compress does:", "",
             "```python", *code, "```"]
    if sentence:
        lines += ["", "Sentence embeddings: pool `hidden` over each sentence's tokens as `1_Pooling/config.json` says "
                  "(and L2-normalise where modules.json lists Normalize), as `compress eval --embedding` does."]
    return lines + [""]


def _sentence_lines(fmt: str, config: dict[str, Any]) -> list[str]:
    """How sentence-transformers (and, for ONNX, Text Embeddings Inference) load a sentence-embedding folder of ``fmt``."""
    call = sentence_transformers_call(fmt)
    if fmt == "torch":
        return ["", "Sentence embeddings:", f"- sentence-transformers: `{call}` (its default PyTorch backend) encodes as "
                "`compress eval --embedding` does."]
    if fmt not in ST_BACKENDS:  # a static folder's line names it already; other formats load in no stock tool
        return []
    lines = ["", "Sentence embeddings:",
             f"- sentence-transformers (through Optimum: `pip install sentence-transformers[{fmt}]`): `{call}` encodes as "
             "`compress eval --embedding` does; its default PyTorch backend finds no PyTorch weights here."]
    tei = fmt == "onnx" and "hidden_size" in config and "num_hidden_layers" in config
    if fmt == "onnx" and not tei:  # DistilBERT's config.json says dim and n_layers
        lines.append("- Text Embeddings Inference refuses it: its ONNX Runtime backend reads hidden_size and "
                     "num_hidden_layers from config.json, which names them otherwise for this family.")
    if tei:
        lines.append("- Text Embeddings Inference (its ONNX Runtime backend): `text-embeddings-router --model-id DIR` opens "
                     "`model.onnx` at the root (where it looks first, before `onnx/model.onnx`) and reads config.json, "
                     "tokenizer.json, `1_Pooling/config.json` (it pools by mean or CLS token only) and "
                     "sentence_bert_config.json's max_seq_length; it L2-normalises unless a request says "
                     "`\"normalize\": false`.")
    readers = "sentence-transformers, Optimum, Text Embeddings Inference" if tei else "sentence-transformers, Optimum"
    lines.append(f"- Layout: the model is stored once, at the root, where {readers} and compress all read it "
                 f"(no copy in `{fmt}/`).")
    return lines
