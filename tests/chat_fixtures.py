"""A tiny Qwen3-style chat tokenizer for the conversation-data tests: byte-level BPE trained on a
few sentences, ChatML specials (<|im_start|>, <|im_end|>), <think>/</think>, and a chat template
written after Qwen3's (system/user/assistant turns, an `enable_thinking` switch whose "off" adds an
empty think block to the generation prompt) with `{% generation %}` tags around each assistant
turn's output, so `apply_chat_template(..., return_assistant_tokens_mask=True)` is the reference."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

QWEN3_STYLE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- if loop.last and enable_thinking is defined and not enable_thinking -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message.content + '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

TEXT = ["def add(a, b): return a + b", "You are a helpful assistant.", "Write a function that sorts a list.",
        "Sure, here is one: sorted(xs)", "What is two plus two? It is four.", "hello world, thanks!"]


def chat_tokenizer(template: str = QWEN3_STYLE_TEMPLATE) -> PreTrainedTokenizerFast:
    """The tiny chat tokenizer (deterministic: same vocabulary on every call)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=template)
