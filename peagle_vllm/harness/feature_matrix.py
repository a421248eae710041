"""The structured-output kinds of the feature matrix (docs/feature-matrix.md), shared by
`tests/integration/test_feature_matrix.py`, `tests/server/test_feature_matrix_served.py` and
`scripts/feature_matrix.py`: for each kind, the instruction appended to a user message, vLLM's
`StructuredOutputsParams` fields, the same constraint as an OpenAI request's fields, and a validity check
of a finished output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
SENTENCE_REGEX = r"Answer: [^\n]{1,400}\."
CHOICES = ["Yes, I can explain that in detail.", "No, I would need more information first.",
           "It depends on what you want to achieve."]
BULLETS_GRAMMAR = 'root ::= item item*\nitem ::= "- " [^\\n]+ "\\n"'


@dataclass(frozen=True)
class Kind:
    """One structured-output kind."""

    name: str
    instruction: str  # appended to the user message, for the constrained and the unconstrained run alike
    params: dict  # StructuredOutputsParams(**params)
    openai: dict = field(default_factory=dict)  # the same constraint as chat.completions.create(**openai)

    def valid(self, text: str) -> bool:
        """Whether a finished (not length-cut) output satisfies the constraint."""
        if self.name in ("json_schema", "json_object"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return False
            if self.name == "json_object":
                return isinstance(value, dict)
            return (isinstance(value, dict) and set(value) == {"answer", "confidence"}
                    and isinstance(value["answer"], str) and isinstance(value["confidence"], (int, float)))
        if self.name == "regex":
            return re.fullmatch(SENTENCE_REGEX, text) is not None
        if self.name == "choice":
            return text in CHOICES
        if self.name == "grammar":
            return re.fullmatch(r"(- [^\n]+\n)+", text) is not None
        raise ValueError(self.name)


KINDS = {k.name: k for k in [
    Kind("json_schema",
         'Reply only with a JSON object: {"answer": a short answer, "confidence": a number from 0 to 1}.',
         {"json": ANSWER_SCHEMA},
         {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}}),
    Kind("json_object", "Reply only with a JSON object.", {"json_object": True},
         {"response_format": {"type": "json_object"}}),
    Kind("regex", 'Answer in one sentence that starts with "Answer:".', {"regex": SENTENCE_REGEX},
         {"extra_body": {"structured_outputs": {"regex": SENTENCE_REGEX}}}),
    Kind("choice", "Can you explain it? Reply with one sentence.", {"choice": CHOICES},
         {"extra_body": {"structured_outputs": {"choice": CHOICES}}}),
    Kind("grammar", "Answer as a short bulleted list.", {"grammar": BULLETS_GRAMMAR},
         {"extra_body": {"structured_outputs": {"grammar": BULLETS_GRAMMAR}}}),
]}


def structured_outputs(kind: str):
    """vLLM's StructuredOutputsParams for a kind."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**KINDS[kind].params)


def messages_for(kind: str, messages: list[str]) -> list[str]:
    """The user messages with the kind's instruction appended."""
    return [f"{m} {KINDS[kind].instruction}" for m in messages]
