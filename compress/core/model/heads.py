"""Task heads as data: one frozen :class:`Head` record per head a model folder can be saved with.

What a head outputs (names in order, which of them score token positions, whether it reads
the first token only), which stock class loads it, which transformers output object its
forward returns and whether its tensors exist only by training are facts of the head, not of
the module asking; every module reads them here (``get_head(name).outputs``, ``.per_token`` ...)
instead of keeping its own table. This is optimum's task-to-outputs table
(``optimum.exporters.tasks.TasksManager`` and ``OnnxConfig._TASK_TO_COMMON_OUTPUTS``) made
into one record per head.

The family-specific part of a head, its transformers class (``RobertaForQuestionAnswering``),
stays with the family (``compress.core.model.families`` builds it from :attr:`Head.class_suffix`).
This module imports nothing heavy: ``compress.core.data.tasks`` reads it before any model library.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress.core.errors import CompressError


@dataclass(frozen=True)
class Head:
    """One task head: its outputs, the classes that build and load it, and how its outputs are laid out."""

    name: str  # as compression.json's "head" and --head write it: "sequence-classification", "base", ...
    outputs: tuple[str, ...]  # output names, in order: an exported graph's outputs, a runner's output fields
    auto_class: str  # the stock transformers class that loads a folder saved with it ("AutoModelForMaskedLM")
    output_class: str  # the transformers.modeling_outputs class its forward returns ("ModelOutput": a family's own)
    class_suffix: str  # its transformers class without the family prefix: "Bert" + "ForSequenceClassification"
    per_token_outputs: tuple[str, ...]  # outputs that score token positions, (batch, seq[, width]): padding must leave them
    first_token: bool = False  # reads the first token's output only: an exported last layer may compute that token alone
    trained: bool = False  # its tensors exist only by training on a task: a folder saved with it must hold them all
    exportable: bool = True  # ONNX / OpenVINO / int8 graph backends write it (not pretraining's two-headed output)
    masked_lm: bool = False  # predicts masked tokens over the vocabulary (MLM logits): a fill-in-the-blank head
    pipeline: str | None = None  # the transformers.pipeline(...) arguments a model card names; None: no pipeline line

    @property
    def per_token(self) -> bool:
        """Whether any output scores token positions (a sequence classifier's logits are one row per example)."""
        return bool(self.per_token_outputs)


HEADS: dict[str, Head] = {h.name: h for h in (
    Head("base", ("last_hidden_state",), "AutoModel", "BaseModelOutput", "Model", ("last_hidden_state",)),
    Head("sequence-classification", ("logits",), "AutoModelForSequenceClassification", "SequenceClassifierOutput",
         "ForSequenceClassification", (), first_token=True, trained=True, pipeline='"text-classification"'),
    Head("token-classification", ("logits",), "AutoModelForTokenClassification", "TokenClassifierOutput",
         "ForTokenClassification", ("logits",), trained=True,
         pipeline='"token-classification", aggregation_strategy="simple"'),
    Head("question-answering", ("start_logits", "end_logits"), "AutoModelForQuestionAnswering",
         "QuestionAnsweringModelOutput", "ForQuestionAnswering", ("start_logits", "end_logits"), trained=True),
    Head("masked-lm", ("logits",), "AutoModelForMaskedLM", "MaskedLMOutput", "ForMaskedLM", ("logits",), masked_lm=True),
    # Its output object is each family's own (BertForPreTrainingOutput); nothing exports or runs it outside PyTorch.
    Head("pretraining", ("prediction_logits", "seq_relationship_logits"), "AutoModelForPreTraining", "ModelOutput",
         "ForPreTraining", ("prediction_logits",), exportable=False, masked_lm=True),
)}
# What graph exporters and int8 backends write; their refusals list the task heads first.
EXPORTABLE_HEADS = tuple(sorted((name for name, h in HEADS.items() if h.exportable), key=lambda name: not HEADS[name].trained))


def get_head(name: str) -> Head:
    """The head called ``name``; an unknown name is refused with the valid ones."""
    if name not in HEADS:
        raise CompressError(f"unknown model head {name!r}; valid: {', '.join(HEADS)}")
    return HEADS[name]
