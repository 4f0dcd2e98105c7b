"""Random-weight stand-ins for published checkpoints, in their exact configuration and on-disk format.

    python benchmarks/make_checkpoint.py --model all --out models [--seed 0] [--layers N] [--vocab-size V]

Users build these 1.5B-8B models, but their weights cannot be downloaded here. The import, the memory
plan, the compiler and the runtime only care about the configuration, the tensor names, shapes, dtypes
and packing, and the tokenizer files, so this script writes those exactly as the published checkpoints
have them, with deterministic random weights. Under --out, each model gets its published directory name
(the one the recipes read as $LLMBUILD_MODELS/<name>):

  Qwen2-7B-Instruct-GPTQ-Int4               GPTQ v1 (AutoGPTQ): per projection qweight int32 [K/8, N]
                                            packed along K, qzeros int32 [K/128, N/8] holding zero - 1
                                            (symmetric: 0x77777777), scales fp16 [K/128, N], g_idx int32
                                            [K] = k // 128, fp16 q/k/v biases (recipe qwen2_7b_w4)
  Qwen2.5-7B-Instruct-AWQ                   AutoAWQ gemm: qweight int32 [K, N/8] and qzeros int32
                                            [K/128, N/8] packed along N in the nibble order 0,2,4,6,1,3,5,7,
                                            scales fp16, asymmetric zero points (recipe qwen2_5_7b_w4_awq)
  Meta-Llama-3-8B-Instruct-AutoRound-int4   AutoRound, auto_gptq packing: GPTQ v1 tensors, no biases
                                            (recipe llama3_8b_w4)
  Qwen3-8B-AWQ                              Qwen's AutoAWQ gemm upload of Qwen3-8B: the AWQ tensors above, no
                                            biases, fp16 per-head q_norm/k_norm after each o_proj, an untied
                                            fp16 lm_head, two 4 GB shards (recipe qwen3_8b_w4_awq)
  Qwen3-4B                                  bf16, tied embeddings (no lm_head), q_norm/k_norm, three 4 GB
                                            shards (3.96, 3.99, 0.10 GB) (recipe qwen3_4b_w4)
  DeepSeek-R1-Distill-Qwen-1.5B             bf16, one model.safetensors (what TPU-MLIR's llm_convert reads)
  InternVL3-2B-hf                           a vision-language model (--model internvl3_2b): InternViT-300M at
                                            448 px, the pixel-shuffle projector and Qwen2.5-1.5B, bf16, in
                                            transformers' native layout (language_model.model.*, vision_tower.*,
                                            multi_modal_projector.*), the image tokens in the tokenizer; with
                                            --vision-layout internvl_chat, InternVL3-2B in the original layout
                                            (InternVLChatConfig, vision_model.*, fused attn.qkv, mlp1.*) with the
                                            same bytes in every tensor (recipes internvl3_2b_w4, _chat_w4)
  InternVL3_5-2B-HF                         InternVL3.5-2B (--model internvl3_5_2b): the same tower with Qwen3-1.7B
                                            (q_norm/k_norm, head_dim 128, an untied lm_head), Qwen3's tokenizer
                                            with InternVL's tokens from 151669; --vision-layout internvl_chat
                                            writes InternVL3_5-2B (llm_config of Qwen3ForCausalLM) (recipe
                                            internvl3_5_2b_w4)
  Qwen3.5-2B-text                           Qwen3.5-2B's language model (--model qwen3_5_2b), bf16, in
                                            transformers' qwen3_5_text layout (Qwen3_5ForCausalLM: model.layers.*,
                                            each layer's linear_attn.* or self_attn.* as its layer_types entry
                                            says; A_log and the (1 + weight) norms as transformers stores them),
                                            one model.safetensors as the 2B's upload (recipe qwen3_5_2b_w4)
  MiniCPM-V-4.6                             MiniCPM-V 4.6 (--model minicpm_v_4_6): SigLIP-400M with the window
                                            merger after layer 6, the 2x2 merger and Qwen3.5-0.8B's language
                                            model, bf16, in transformers' native minicpmv4_6 layout
                                            (model.language_model.*, model.vision_tower.*, model.merger.*, the
                                            head tied), preprocessor_config.json (slices of 448), a stand-in
                                            tokenizer: Qwen3.5's with MiniCPM-V's image tokens from 248066
                                            (recipe minicpm_v_4_6_w4)

The config.json is the published one shipped in recipes/configs/ (the source of truth); the quantized
models keep embeddings, lm_head and norms in fp16 and are sharded like their uploads (model-0000i-of-0000n
plus model.safetensors.index.json). Each directory also gets generation_config.json and a real tokenizer:
a byte-level BPE trained on llmbuild/data/corpus.txt with the model's own pre-tokenizer, padded to the
published BPE size with unreachable filler entries of the BPE model itself (150k added tokens would make
every encode slow), the published special tokens at their published ids, and a chat template in the style
of the published one. A stamp file (random_checkpoint.json) records the generator's parameters.

Weights follow llmbuild/frontend/synthetic.py's init scales, so greedy decoding has clear top-2 gaps:
embeddings and lm_head 0.25, norms 1 +- 0.1 with the final norm spreading the logits to about LOGIT_STD,
biases 0.1; projections dequantize to std about LINEAR_GAIN / sqrt(fan_in) with a gain of 1, not the tiny
models' 2. A trained model is not chaotic, and a stand-in must not be either, or the build's end-to-end
check measures the stand-in's sensitivity instead of the compiler: at gain 2 the 28-layer 1.5B turned a
0.1% perturbation of its embedding into logits at cosine 0.99972 (0.4%: 0.9958), and bf16 rounding alone
into 0.983; at gain 1 the same 0.1% gives 0.9999979 (0.4%: 0.99997). Quantizing float weights
of a 7B model would take far too long, so the 4-bit levels are random int32 words and the per-group scales
(and AWQ zero points) are chosen so the dequantized weights have that std. The levels must also be centred
on the zero point, as a real quantized weight's are: uniform nibbles average 7.5, and against GPTQ's fixed
symmetric zero of 8 that offset of -scale/2 in every weight, summed over thousands of inputs, adds the same
amount to every output, a common mode that grows through the layers until every position decodes to the
same token (measured: residual RMS 1e5 by layer 21 of the 7B). So the symmetric formats turn each 0 nibble
into 8 (levels 1..15, symmetric about 8), and AWQ keeps uniform nibbles with zero points averaging 7.5.

--layers N and --vocab-size V write a truncated variant for fast tests (the first N layers at the real
shapes, V rows of embedding and head, the special tokens moved down to keep their distance from the end of
the vocabulary); its config.json says so under "llmbuild_truncated".

Deterministic: every tensor draws from its own generator seeded by (--seed, model, tensor name), so two
runs give byte-identical files (with the same numpy), and a truncated variant's layers are the full
model's first layers. Streaming: the safetensors headers are computed from the shapes
first and each tensor is written in blocks as it is drawn, so memory stays at a few hundred MB. Atomic: a
checkpoint is written into a temporary sibling directory that is renamed into place when complete; a
complete, current checkpoint is skipped unless --force.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import struct
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from llmbuild import LlmbuildError  # noqa: E402
from llmbuild.families.layout import expected_shapes  # noqa: E402
from llmbuild.families.minicpmv4_6.family import IMAGE_TOKENS as MINICPMV4_6_IMAGE_TOKENS  # noqa: E402
from llmbuild.families.minicpmv4_6.synthetic import processor_config as minicpmv4_6_processor_config  # noqa: E402
from llmbuild.families.registry import family_for_hf_model_type, get_family  # noqa: E402
from llmbuild.frontend.atomic import atomic_directory  # noqa: E402
from llmbuild.frontend.synthetic import BIAS_STD, CORPUS, EMBED_STD, LOGIT_STD, NORM_SPREAD  # noqa: E402
from llmbuild.frontend.tokenizer_files import PRE_TOKENIZER_SPLITS, write_json  # noqa: E402
from llmbuild.quant.readers import AWQ_ORDER  # noqa: E402

# Bump whenever the bytes written for the same parameters change: the stamp then no longer matches and
# existing checkpoints are rewritten instead of silently kept.
GENERATOR_VERSION = 3
LINEAR_GAIN = 1.0  # projections' std times sqrt(fan_in): see the module docstring
DEFAULT_SEED = 0
STAMP_FILE = "random_checkpoint.json"
CONFIGS = ROOT / "recipes" / "configs"
BLOCK_ELEMENTS = 1 << 24  # values drawn and written per block: 64 MB of float32 at most
SCALE_JITTER = 0.25  # per-group scales vary by a factor in [1 - j, 1 + j], as real groups do
AWQ_ZEROS = (5, 10)  # AWQ zero points, uniform over this range (inclusive): mean 7.5, that of uniform levels
SYM_ZERO = 8  # GPTQ / AutoRound symmetric 4-bit zero point
_NIBBLE_LOW_BITS = np.uint32(0x11111111)  # bit 0 of every 4-bit field
MIN_TRAINED = 256 + 64  # a truncated tokenizer keeps at least the 256 bytes and some merges
TRAIN_VOCAB_CAP = 32000  # the corpus runs out of pairs seen twice long before this

# safetensors' Dtype enum order: its writer puts tensors in descending dtype order, then by name.
_DTYPE_RANK = {"BOOL": 0, "U8": 1, "I8": 2, "I16": 5, "U16": 6, "F16": 7, "BF16": 8, "I32": 9, "U32": 10,
               "F32": 11, "F64": 12, "I64": 13, "U64": 14}  # fmt: skip
_DTYPE_BYTES = {"F16": 2, "BF16": 2, "I32": 4, "F32": 4}


# ---- the published models ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Special:
    content: str
    special: bool = True  # False: an added token that decode(skip_special_tokens=True) keeps (<tool_call>, ...)


@dataclass(frozen=True)
class TokenizerStyle:
    """How the published tokenizer.json / tokenizer_config.json are built (ids are the published ones)."""

    split: str  # the pre-tokenizer's split regex
    nfc: bool  # NFC normalizer
    bos_prefix: str | None  # a post-processor prepends this token (encode with special tokens)
    ignore_merges: bool
    bpe_size: int  # ids below are the BPE vocabulary; specials follow from here, in order
    specials: tuple[Special, ...]
    chat_template: str
    config: Mapping[str, Any]  # tokenizer_config.json fields besides added_tokens_decoder and chat_template


@dataclass(frozen=True)
class Published:
    key: str  # --model value
    directory: str  # the published directory name
    repo: str  # where the real one lives (documentation only)
    config_file: str  # recipes/configs/<file>: the published config.json
    packing: str  # "gptq" (v1 layout), "awq" (gemm) or "float"
    float_dtype: str  # safetensors dtype of every float tensor
    shard_bytes: int | None  # max shard size of the upload; None: one model.safetensors
    tokenizer: TokenizerStyle
    generation: Mapping[str, Any]  # the published generation_config.json
    extra: Mapping[str, Any] = field(default_factory=dict)
    chat_directory: str | None = None  # a vision-language model: the directory of its internvl_chat layout


def _qwen_specials(extra: tuple[Special, ...] = ()) -> tuple[Special, ...]:
    return (Special("<|endoftext|>"), Special("<|im_start|>"), Special("<|im_end|>"), *extra)


_QWEN25_EXTRA = (
    *(Special(t) for t in ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                           "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                           "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")),
    *(Special(t, special=False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                                          "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")),
)  # fmt: skip
_DEEPSEEK_SPECIALS = (
    Special("<｜end▁of▁sentence｜>"), Special("<｜User｜>", special=False), Special("<｜Assistant｜>", special=False),
    Special("<｜begin▁of▁sentence｜>"), Special("<|EOT|>", special=False), Special("<think>", special=False),
    Special("</think>", special=False), *_QWEN25_EXTRA[4:],
)  # fmt: skip


def _llama3_specials() -> tuple[Special, ...]:
    """Llama 3's 256 specials at 128000..128255: five named ones, the rest reserved, numbered in order."""
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
             9: "<|eot_id|>"}  # fmt: skip
    reserved = iter(range(256))
    return tuple(Special(named.get(i) or f"<|reserved_special_token_{next(reserved)}|>") for i in range(256))


# Qwen2-7B-Instruct's template: ChatML with a default system prompt.
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2.5-Instruct's template: ChatML with Qwen's system prompt and its tool-call format.
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 - the published template's lines
# Qwen3's template: ChatML without a default system prompt, Qwen2.5's tool-call format with tool responses
# folded into user turns, reasoning (<think>...</think>) kept only after the last real user query, and
# `enable_thinking=False` answering with an empty think block.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 - the published template's lines
# Llama-3-Instruct's template: headers, <|eot_id|> after each turn, bos_token first.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# DeepSeek-R1's template (the revision that opens the answer with <think>): system prompt after bos, then
# <｜User｜>/<｜Assistant｜> turns with earlier reasoning cut off, and its tool-call format.
DEEPSEEK_R1_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}"
    "{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'"
    " + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```'"
    " + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}"
    "{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name']"
    " + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}"
    "{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}"
    "{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}"
    "{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)

_QWEN_TOKENIZER_CONFIG = {
    "add_prefix_space": False, "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
    "errors": "replace", "pad_token": "<|endoftext|>", "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
}  # fmt: skip
_QWEN_GENERATION = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0",
}  # fmt: skip
QWEN2_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["qwen2"], nfc=True, bos_prefix=None, ignore_merges=False, bpe_size=151643,
    specials=_qwen_specials(), chat_template=QWEN2_TEMPLATE,
    config=_QWEN_TOKENIZER_CONFIG | {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                                     "model_max_length": 32768},
)  # fmt: skip
QWEN25_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["qwen2"], nfc=True, bos_prefix=None, ignore_merges=False, bpe_size=151643,
    specials=_qwen_specials(_QWEN25_EXTRA), chat_template=QWEN25_TEMPLATE,
    config=_QWEN_TOKENIZER_CONFIG | {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", *(s.content for s in _QWEN25_EXTRA[:11])],
        "model_max_length": 131072,
    },
)  # fmt: skip
# Qwen3's tokenizer: Qwen2.5's, then <tool_response>, </tool_response>, <think> and </think> (151665-151668,
# plain added tokens that decoding keeps).
_QWEN3_EXTRA = (*_QWEN25_EXTRA, *(Special(t, special=False) for t in ("<tool_response>", "</tool_response>",
                                                                       "<think>", "</think>")))  # fmt: skip
QWEN3_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["qwen2"], nfc=True, bos_prefix=None, ignore_merges=False, bpe_size=151643,
    specials=_qwen_specials(_QWEN3_EXTRA), chat_template=QWEN3_TEMPLATE,
    config=_QWEN_TOKENIZER_CONFIG | {
        "add_bos_token": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", *(s.content for s in _QWEN25_EXTRA[:11])],
        "model_max_length": 131072,
    },
)  # fmt: skip
# Qwen3's generation_config.json (the thinking mode's sampling).
_QWEN3_GENERATION = {
    "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
    "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0",
}  # fmt: skip
LLAMA3_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["llama3"], nfc=False, bos_prefix="<|begin_of_text|>", ignore_merges=True,
    bpe_size=128000, specials=_llama3_specials(), chat_template=LLAMA3_TEMPLATE,
    config={
        "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True, "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 1000000000000000019884624838656,
        "tokenizer_class": "PreTrainedTokenizerFast",
    },
)  # fmt: skip
DEEPSEEK_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["deepseek-r1-qwen"], nfc=True, bos_prefix="<｜begin▁of▁sentence｜>",
    ignore_merges=False, bpe_size=151643, specials=_DEEPSEEK_SPECIALS, chat_template=DEEPSEEK_R1_TEMPLATE,
    config={
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<｜begin▁of▁sentence｜>",
        "clean_up_tokenization_spaces": False, "eos_token": "<｜end▁of▁sentence｜>", "legacy": True,
        "model_max_length": 16384, "pad_token": "<｜end▁of▁sentence｜>", "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizerFast", "unk_token": None, "use_default_system_prompt": False,
    },
)  # fmt: skip
# InternVL3's tokenizer: Qwen2.5's, then InternVL's tokens from 151665 (<IMG_CONTEXT> at 151667, the config's
# image_token_id), and the chat template transformers' conversion gives the -hf checkpoints.
_INTERNVL_SPECIALS = tuple(Special(t) for t in ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>",
                                                "</ref>", "<box>", "</box>"))  # fmt: skip
INTERNVL_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
INTERNVL_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["qwen2"], nfc=True, bos_prefix=None, ignore_merges=False, bpe_size=151643,
    specials=_qwen_specials((*_QWEN25_EXTRA, *_INTERNVL_SPECIALS)), chat_template=INTERNVL_TEMPLATE,
    config=_QWEN_TOKENIZER_CONFIG | {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", *(s.content for s in _QWEN25_EXTRA[:11]),
                                      *(s.content for s in _INTERNVL_SPECIALS)],
        "model_max_length": 8192,
    },
)  # fmt: skip
# InternVL3.5's tokenizer (Qwen3 language models): Qwen3's, then the same InternVL tokens from 151669 (Qwen3's
# own end at </think> 151668), so <IMG_CONTEXT> is 151671, the config's image_token_id.
INTERNVL3_5_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["qwen2"], nfc=True, bos_prefix=None, ignore_merges=False, bpe_size=151643,
    specials=_qwen_specials((*_QWEN3_EXTRA, *_INTERNVL_SPECIALS)), chat_template=INTERNVL_TEMPLATE,
    config=_QWEN_TOKENIZER_CONFIG | {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", *(s.content for s in _QWEN25_EXTRA[:11]),
                                      *(s.content for s in _INTERNVL_SPECIALS)],
        "model_max_length": 40960,
    },
)  # fmt: skip

MODELS: dict[str, Published] = {
    m.key: m
    for m in (
        Published(
            key="qwen2_7b_gptq", directory="Qwen2-7B-Instruct-GPTQ-Int4", repo="Qwen/Qwen2-7B-Instruct-GPTQ-Int4",
            config_file="qwen2_7b_instruct_gptq_int4.json", packing="gptq", float_dtype="F16",
            shard_bytes=4_000_000_000, tokenizer=QWEN2_TOKENIZER, generation=_QWEN_GENERATION,
        ),
        Published(
            key="qwen2_5_7b_awq", directory="Qwen2.5-7B-Instruct-AWQ", repo="Qwen/Qwen2.5-7B-Instruct-AWQ",
            config_file="qwen2_5_7b_instruct_awq.json", packing="awq", float_dtype="F16",
            shard_bytes=4_000_000_000, tokenizer=QWEN25_TOKENIZER, generation=_QWEN_GENERATION,
        ),
        Published(
            key="llama3_8b_autoround", directory="Meta-Llama-3-8B-Instruct-AutoRound-int4",
            repo="Meta-Llama-3-8B-Instruct, AutoRound int4 (auto_gptq packing)",
            config_file="llama3_8b_instruct_autoround_int4.json", packing="gptq", float_dtype="F16",
            shard_bytes=5_000_000_000, tokenizer=LLAMA3_TOKENIZER,
            generation={"bos_token_id": 128000, "eos_token_id": [128001, 128009], "do_sample": True,
                        "temperature": 0.6, "max_length": 4096, "top_p": 0.9,
                        "transformers_version": "4.40.0.dev0"},
        ),
        Published(
            key="qwen3_8b_awq", directory="Qwen3-8B-AWQ", repo="Qwen/Qwen3-8B-AWQ", config_file="qwen3_8b_awq.json",
            packing="awq", float_dtype="F16", shard_bytes=4_000_000_000, tokenizer=QWEN3_TOKENIZER,
            generation=_QWEN3_GENERATION,
        ),
        Published(
            key="qwen3_4b", directory="Qwen3-4B", repo="Qwen/Qwen3-4B", config_file="qwen3_4b.json",
            packing="float", float_dtype="BF16", shard_bytes=4_000_000_000, tokenizer=QWEN3_TOKENIZER,
            generation=_QWEN3_GENERATION,
        ),
        Published(
            key="deepseek_r1_qwen_1_5b", directory="DeepSeek-R1-Distill-Qwen-1.5B",
            repo="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", config_file="deepseek_r1_distill_qwen_1_5b.json",
            packing="float", float_dtype="BF16", shard_bytes=None, tokenizer=DEEPSEEK_TOKENIZER,
            generation={"_from_model_config": True, "bos_token_id": 151646, "eos_token_id": 151643,
                        "do_sample": True, "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.39.3"},
        ),
    )
}  # fmt: skip
# Vision-language models: config.json nests the language model's fields under text_config (the tests' small
# text variants of MODELS do not apply to them).
VLM_MODELS: dict[str, Published] = {
    "internvl3_2b": Published(
        key="internvl3_2b", directory="InternVL3-2B-hf", repo="OpenGVLab/InternVL3-2B-hf (and OpenGVLab/InternVL3-2B)",
        config_file="internvl3_2b_hf.json", packing="float", float_dtype="BF16", shard_bytes=None,
        tokenizer=INTERNVL_TOKENIZER, chat_directory="InternVL3-2B",
        generation={"bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643,
                    "transformers_version": "4.52.0.dev0"},
    ),
    "internvl3_5_2b": Published(
        key="internvl3_5_2b", directory="InternVL3_5-2B-HF",
        repo="OpenGVLab/InternVL3_5-2B-HF (and OpenGVLab/InternVL3_5-2B)",
        config_file="internvl3_5_2b_hf.json", packing="float", float_dtype="BF16", shard_bytes=None,
        tokenizer=INTERNVL3_5_TOKENIZER, chat_directory="InternVL3_5-2B",
        generation={"bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643,
                    "transformers_version": "4.52.0.dev0"},
        extra={"llm_name_or_path": "./pretrained/Qwen3-1.7B"},
    ),
}  # fmt: skip
# Qwen3.5's tokenizer: Qwen2.5's special tokens in the same order from 248044 (its config's eos_token_id;
# vision_start at 248053 and image_pad at 248056, as the published Qwen3.5 configs give them).
QWEN35_TOKENIZER = TokenizerStyle(
    split=PRE_TOKENIZER_SPLITS["qwen2"], nfc=True, bos_prefix=None, ignore_merges=False, bpe_size=248044,
    specials=_qwen_specials(_QWEN25_EXTRA), chat_template=QWEN25_TEMPLATE,
    config=QWEN25_TOKENIZER.config | {"model_max_length": 262144},
)
# Hybrid (linear-attention) language models: every layer's tensors as its kind has them.
HYBRID_MODELS: dict[str, Published] = {
    "qwen3_5_2b": Published(
        key="qwen3_5_2b", directory="Qwen3.5-2B-text", repo="Qwen/Qwen3.5-2B (its language model)",
        config_file="qwen3_5_2b.json", packing="float", float_dtype="BF16", shard_bytes=None,
        tokenizer=QWEN35_TOKENIZER,
        generation={"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
                    "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                    "transformers_version": "5.25.0"},
    ),
}  # fmt: skip
# MiniCPM-V 4.6's tokenizer (a stand-in for the published one): Qwen3.5's, then the image tokens the family's
# processor writes from 248066 (<unk>, the rows the image features fill, at 248070: the config's image_token_id).
MINICPMV4_6_TOKENIZER = replace(
    QWEN35_TOKENIZER, specials=_qwen_specials((*_QWEN25_EXTRA, *(Special(t) for t in MINICPMV4_6_IMAGE_TOKENS))))
# Vision-language models on Qwen3.5: the hybrid text model under model.language_model., the tower and mergers
# beside it, and the image processor's preprocessor_config.json.
HYBRID_VLM_MODELS: dict[str, Published] = {
    "minicpm_v_4_6": Published(
        key="minicpm_v_4_6", directory="MiniCPM-V-4.6", repo="openbmb/MiniCPM-V-4.6",
        config_file="minicpm_v_4_6.json", packing="float", float_dtype="BF16", shard_bytes=None,
        tokenizer=MINICPMV4_6_TOKENIZER,
        generation={"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
                    "transformers_version": "5.7.0"},
        extra={"preprocessor_config": minicpmv4_6_processor_config({})},
    ),
}  # fmt: skip
ALL_MODELS = MODELS | VLM_MODELS | HYBRID_MODELS | HYBRID_VLM_MODELS


# ---- configuration of one (possibly truncated) checkpoint --------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What gets written: the config.json and where the tokenizer's specials land."""

    model: Published
    config: dict[str, Any]
    id_shift: int  # published id - written id, for ids of special tokens (0 unless --vocab-size)

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config fields (a vision-language config.json's text_config)."""
        return self.config.get("text_config", self.config)

    @property
    def bpe_size(self) -> int:
        return self.model.tokenizer.bpe_size - self.id_shift

    def token_id(self, published_id: int) -> int:
        return published_id - self.id_shift if published_id >= self.model.tokenizer.bpe_size else published_id

    def token_ids(self, value: Any) -> Any:
        """A config's token id field (int, list or None) with ids moved for a truncated vocabulary."""
        if isinstance(value, list):
            return [self.token_id(v) for v in value]
        return self.token_id(value) if isinstance(value, int) else value


def layout_for(
    model: Published, layers: int | None = None, vocab_size: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Layout:
    """The published config, or a truncated variant: fewer layers, a smaller vocabulary (the specials keep
    their distance from the end), and `overrides` (smaller layer shapes, for tests). The config then says so."""
    whole = json.loads((CONFIGS / model.config_file).read_text(encoding="utf-8"))
    whole.pop("_comment", None)  # the shipped copy's note, not a field of the published config.json
    published = whole.get("text_config", whole)  # a vision-language model's truncation is its text model's
    config = dict(published) | dict(overrides or {})
    full_layers, full_vocab = published["num_hidden_layers"], published["vocab_size"]
    if layers is not None and not 1 <= layers <= full_layers:
        raise LlmbuildError(f"--layers must be in 1..{full_layers} for {model.directory}, got {layers}")
    if vocab_size is not None and not vocab_size <= full_vocab:
        raise LlmbuildError(f"--vocab-size must be at most {full_vocab} for {model.directory}, got {vocab_size}")
    shift = full_vocab - (vocab_size or full_vocab)
    if model.tokenizer.bpe_size - shift < MIN_TRAINED:
        raise LlmbuildError(f"--vocab-size must be at least {full_vocab - model.tokenizer.bpe_size + MIN_TRAINED} "
                            f"for {model.directory} (its specials plus a byte-level BPE)")  # fmt: skip
    vlm = "text_config" in whole
    out = Layout(model, dict(whole) | {"text_config": config} if vlm else config, shift)
    if vlm:
        out.config["image_token_id"] = out.token_id(whole["image_token_id"])
    config["num_hidden_layers"] = layers or full_layers
    config["vocab_size"] = full_vocab - shift
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in config:
            config[key] = out.token_ids(config[key])
    if config != published:
        out.config["llmbuild_truncated"] = {
            "note": f"random weights, a truncated {model.directory} (benchmarks/make_checkpoint.py)",
            "published_num_hidden_layers": full_layers,
            "published_vocab_size": full_vocab,
            "special_token_id_shift": shift,
            "overrides": dict(overrides or {}),
        }
    return out


# ---- tensors ----------------------------------------------------------------------------------------------

Fill = Callable[[np.random.Generator, tuple[int, ...]], Iterator[np.ndarray]]


@dataclass(frozen=True)
class TensorPlan:
    name: str  # the HF tensor name
    dtype: str  # safetensors dtype
    shape: tuple[int, ...]
    fill: Fill | None  # yields the tensor's values in row blocks, drawn from the generator it is given
    # A tensor stored as others' rows one after another (a fused qkv), each drawn as its own name would be:
    # both layouts of a vision-language model then hold the same values.
    parts: tuple[TensorPlan, ...] = ()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _DTYPE_BYTES[self.dtype]


def _row_blocks(shape: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Shapes of consecutive row blocks of about BLOCK_ELEMENTS values covering `shape`."""
    row = math.prod(shape[1:])
    step = max(1, BLOCK_ELEMENTS // max(row, 1))
    for start in range(0, shape[0], step):
        yield (min(step, shape[0] - start), *shape[1:])


def _to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F16":
        return x.astype("<f2")
    if dtype == "BF16":  # round to nearest even into the top 16 bits (numpy has no bfloat16)
        u = x.view(np.uint32)
        r = u >> 16
        r &= 1
        r += 0x7FFF
        r += u
        r >>= 16
        return r.astype("<u2")
    if dtype == "F32":
        return x.astype("<f4")
    raise ValueError(f"unsupported float dtype {dtype}")


def fill_normal(std: float, dtype: str, rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    for block in _row_blocks(shape):
        x = rng.standard_normal(block, dtype=np.float32)
        x *= np.float32(std)
        yield _to_dtype(x, dtype)


def fill_norm(scale: float, dtype: str, rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    # 1 +- spread rather than exactly 1, so a norm applied to the wrong tensor would show.
    x = scale * (1.0 + rng.uniform(-NORM_SPREAD, NORM_SPREAD, size=shape))
    yield _to_dtype(x.astype(np.float32), dtype)


def center_levels(words: np.ndarray) -> np.ndarray:
    """Turn every 0 nibble of uint32 `words` into 8, in place: uniform levels 0..15 become 1..15 with 8
    twice as likely, symmetric about the symmetric zero point 8."""
    any_bit = words | (words >> 1)  # bit 4p of any_bit: some bit of nibble p is set
    any_bit |= words >> 2
    any_bit |= words >> 3
    words |= (~any_bit & _NIBBLE_LOW_BITS) << np.uint32(3)
    return words


def fill_random_words(centered: bool, rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    """int32 words of packed 4-bit levels, every nibble independent (whichever order the format packs them
    in): uniform, or `centered` on 8."""
    for block in _row_blocks(shape):
        words = rng.integers(0, 1 << 32, size=block, dtype=np.uint32)
        yield (center_levels(words) if centered else words).view("<i4")


def fill_constant_words(value: int, rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    for block in _row_blocks(shape):
        yield np.full(block, value, dtype=np.uint32).view("<i4")


def fill_awq_zeros(rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    """qzeros [K/g, N/8]: zero point of column 8w + AWQ_ORDER[p] in nibble p of word w."""
    groups, words = shape
    zeros = rng.integers(AWQ_ZEROS[0], AWQ_ZEROS[1] + 1, size=(groups, words, 8), dtype=np.uint32)
    packed = np.zeros((groups, words), dtype=np.uint32)
    for p, column in enumerate(AWQ_ORDER):
        packed |= zeros[:, :, column] << np.uint32(4 * p)
    yield packed.view("<i4")


def fill_scales(base: float, rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    # Jitter per group and column; dividing by sqrt(E[j^2]) keeps the weights' mean square at base^2 * levels.
    jitter = rng.uniform(1 - SCALE_JITTER, 1 + SCALE_JITTER, size=shape)
    yield (base / math.sqrt(1 + SCALE_JITTER**2 / 3) * jitter).astype("<f2")


def fill_group_index(group: int, rng: np.random.Generator, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    yield (np.arange(shape[0]) // group).astype("<i4")


def level_probabilities(centered: bool) -> np.ndarray:
    """P(level) of fill_random_words' nibbles."""
    p = np.full(16, 1 / 16)
    if centered:
        p[SYM_ZERO] += p[0]
        p[0] = 0.0
    return p


def level_mean_square(centered: bool, zeros: tuple[int, int]) -> float:
    """E[(q - z)^2] for the levels' distribution and z uniform over `zeros` (inclusive)."""
    q = np.arange(16)[:, None]
    z = np.arange(zeros[0], zeros[1] + 1)[None, :]
    return float((level_probabilities(centered) @ ((q - z) ** 2)).mean())


def quantized_tensors(model: Published, prefix: str, n: int, k: int, group: int) -> list[TensorPlan]:
    """The packed tensors of one [N, K] projection, dequantizing to std LINEAR_GAIN / sqrt(K)."""
    groups = k // group
    awq = model.packing == "awq"
    zeros = AWQ_ZEROS if awq else (SYM_ZERO, SYM_ZERO)
    base = LINEAR_GAIN / math.sqrt(k) / math.sqrt(level_mean_square(not awq, zeros))
    scales = TensorPlan(f"{prefix}.scales", "F16", (groups, n), partial(fill_scales, base))
    if awq:
        return [
            TensorPlan(f"{prefix}.qweight", "I32", (k, n // 8), partial(fill_random_words, False)),
            TensorPlan(f"{prefix}.qzeros", "I32", (groups, n // 8), fill_awq_zeros),
            scales,
        ]
    # GPTQ v1 (and AutoRound's auto_gptq packing) stores zero - 1 in every nibble: 8 -> 0x77777777.
    stored_zero = sum((SYM_ZERO - 1) << (4 * j) for j in range(8))
    return [
        TensorPlan(f"{prefix}.qweight", "I32", (k // 8, n), partial(fill_random_words, True)),
        TensorPlan(f"{prefix}.qzeros", "I32", (groups, n // 8), partial(fill_constant_words, stored_zero)),
        scales,
        TensorPlan(f"{prefix}.g_idx", "I32", (k,), partial(fill_group_index, group)),
    ]


def tensor_plans(layout: Layout) -> list[TensorPlan]:
    """Every tensor in the order transformers' save_pretrained meets them (module registration order)."""
    model, config = layout.model, layout.text
    arch = get_family(family_for_hf_model_type(config["model_type"]))
    spec = arch.spec_from_hf_config(config, origin=model.config_file)
    shapes = expected_shapes(spec)
    dtype = model.float_dtype
    group = (config.get("quantization_config") or {}).get("group_size", 0)
    plans = [TensorPlan("model.embed_tokens.weight", dtype, shapes["embed_tokens.weight"],
                        partial(fill_normal, EMBED_STD, dtype))]  # fmt: skip
    for i in range(spec.num_layers):
        for module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):  # fmt: skip
            name = f"layers.{i}.{module}"
            n, k = shapes[name + ".weight"]
            if model.packing == "float":
                plans.append(TensorPlan(f"model.{name}.weight", dtype, (n, k),
                                        partial(fill_normal, LINEAR_GAIN / math.sqrt(k), dtype)))  # fmt: skip
            else:
                plans += quantized_tensors(model, f"model.{name}", n, k, group)
            if name + ".bias" in shapes:
                plans.append(TensorPlan(f"model.{name}.bias", dtype, (n,), partial(fill_normal, BIAS_STD, dtype)))
            if module == "self_attn.o_proj" and spec.qk_norm:  # Qwen3Attention registers them after o_proj
                for norm in ("q_norm", "k_norm"):
                    plans.append(TensorPlan(f"model.layers.{i}.self_attn.{norm}.weight", dtype, (spec.head_dim,),
                                            partial(fill_norm, 1.0, dtype)))  # fmt: skip
        for norm in ("input_layernorm", "post_attention_layernorm"):
            plans.append(TensorPlan(f"model.layers.{i}.{norm}.weight", dtype, (spec.hidden_size,),
                                    partial(fill_norm, 1.0, dtype)))  # fmt: skip
    # The final norm feeds the head: its scale sets how far the logits spread (as in synthetic.py).
    final = LOGIT_STD / (EMBED_STD * math.sqrt(spec.hidden_size))
    plans.append(TensorPlan("model.norm.weight", dtype, (spec.hidden_size,), partial(fill_norm, final, dtype)))
    if not spec.tie_word_embeddings:
        head = partial(fill_normal, EMBED_STD, dtype)
        plans.append(TensorPlan("lm_head.weight", dtype, shapes["lm_head.weight"], head))
    return plans


def fill_uniform(lo: float, hi: float, dtype: str, rng: np.random.Generator, shape: tuple[int, ...]
                 ) -> Iterator[np.ndarray]:
    yield _to_dtype(rng.uniform(lo, hi, size=shape).astype(np.float32), dtype)


def fill_log_uniform(lo: float, hi: float, dtype: str, rng: np.random.Generator, shape: tuple[int, ...]
                     ) -> Iterator[np.ndarray]:
    yield _to_dtype(np.log(rng.uniform(lo, hi, size=shape)).astype(np.float32), dtype)


# Qwen3.5's norms that transformers scales by (1 + weight): their files hold gamma - 1 (about 0).
_ONE_CENTRED_NORMS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")


def hybrid_tensor_plans(layout: Layout) -> list[TensorPlan]:
    """A Qwen3.5 text model's tensors in Qwen3_5ForCausalLM's order: the embedding, each layer's tensors as
    its kind has them (the family's own list), the final norm, the head unless tied. Projections at
    LINEAR_GAIN; the linear layer's decay rates (A_log = log of U(1, 16)), time-step biases (U(0.5, 1.5))
    and convolution taps (unit gain over the kernel) in transformers' initial ranges, as
    llmbuild/frontend/synthetic.py draws them; A_log in float32, as the upload keeps it."""
    model, config = layout.model, layout.text
    arch = get_family(family_for_hf_model_type(config["model_type"]))
    spec = arch.spec_from_hf_config(config, origin=model.config_file)
    shapes = expected_shapes(spec)
    dtype = model.float_dtype
    plans = [TensorPlan("model.embed_tokens.weight", dtype, shapes["embed_tokens.weight"],
                        partial(fill_normal, EMBED_STD, dtype))]  # fmt: skip
    for i in range(spec.num_layers):
        for name, shape in arch.tensor_shapes_of_layer(spec, i).items():
            full = f"model.layers.{i}.{name}"
            module = name.rsplit(".", 1)[0]
            if module in _ONE_CENTRED_NORMS:
                fill = partial(fill_uniform, -NORM_SPREAD, NORM_SPREAD, dtype)
            elif name.endswith("norm.weight"):  # the linear layer's output norm scales by weight
                fill = partial(fill_norm, 1.0, dtype)
            elif name == "linear_attn.A_log":
                plans.append(TensorPlan(full, "F32", shape, partial(fill_log_uniform, 1.0, 16.0, "F32")))
                continue
            elif name == "linear_attn.dt_bias":
                fill = partial(fill_uniform, 0.5, 1.5, dtype)
            elif name == "linear_attn.conv1d.weight":
                fill = partial(fill_normal, 1 / math.sqrt(shape[-1]), dtype)
            else:
                fill = partial(fill_normal, LINEAR_GAIN / math.sqrt(shape[-1]), dtype)
            plans.append(TensorPlan(full, dtype, shape, fill))
    # The final norm feeds the head: its scale sets how far the logits spread (stored less one).
    final = LOGIT_STD / (EMBED_STD * math.sqrt(spec.hidden_size))
    plans.append(TensorPlan("model.norm.weight", dtype, (spec.hidden_size,),
                            partial(fill_uniform, final * (1 - NORM_SPREAD) - 1, final * (1 + NORM_SPREAD) - 1,
                                    dtype)))  # fmt: skip
    if not spec.tie_word_embeddings:
        head = partial(fill_normal, EMBED_STD, dtype)
        plans.append(TensorPlan("lm_head.weight", dtype, shapes["lm_head.weight"], head))
    return plans


# InternViT's layer scales (lambda_1/2): small, as trained towers' are, so 24 residual blocks stay close to
# their input instead of compounding into chaos (see the module docstring on stand-ins).
LAYER_SCALE = (0.05, 0.15)
POSITION_STD = 0.5  # class token and position embeddings, next to patch embeddings of about unit size


def vision_plan(name: str, shape: tuple[int, ...], dtype: str) -> TensorPlan:
    """A vision tower or projector tensor (native name without `model.`), filled by its kind."""
    if name.endswith(("layernorm_before.weight", "layernorm_after.weight", "layer_norm.weight")):
        fill: Fill = partial(fill_norm, 1.0, dtype)
    elif name.endswith(".bias"):
        fill = partial(fill_normal, BIAS_STD, dtype)
    elif ".lambda_" in name:
        fill = partial(fill_uniform, *LAYER_SCALE, dtype)
    elif name.endswith(("cls_token", "position_embeddings")):
        fill = partial(fill_normal, POSITION_STD, dtype)
    else:
        fill = partial(fill_normal, LINEAR_GAIN / math.sqrt(math.prod(shape[1:])), dtype)
    return TensorPlan(name, dtype, shape, fill)


def vlm_tensor_plans(layout: Layout) -> list[TensorPlan]:
    """A vision-language model's tensors in the -hf upload's names: the language model under
    `language_model.` (drawn as the text model's), the tower and projector as transformers has them."""
    from llmbuild.families.internvl.synthetic import vision_shapes

    plans = []
    for plan in tensor_plans(layout):
        name = plan.name.replace("model.", "language_model.model.", 1) if plan.name.startswith("model.") else (
            "language_model." + plan.name)
        plans.append(TensorPlan(name, plan.dtype, plan.shape, plan.fill))
    config = {k: v for k, v in layout.config.items() if k != "llmbuild_truncated"}
    for name, shape in sorted(vision_shapes(config).items()):
        plans.append(vision_plan(name.removeprefix("model."), shape, layout.model.float_dtype))
    return plans


def siglip_plan(name: str, shape: tuple[int, ...], dtype: str) -> TensorPlan:
    """A SigLIP tower or MiniCPM-V merger tensor (model.vision_tower.*, model.merger.*), filled by its kind."""
    if re.search(r"(norm\d?|layernorm)\.weight$", name):
        fill: Fill = partial(fill_norm, 1.0, dtype)
    elif name.endswith(".bias"):
        fill = partial(fill_normal, BIAS_STD, dtype)
    elif name.endswith("position_embedding.weight"):
        fill = partial(fill_normal, POSITION_STD, dtype)
    else:
        fill = partial(fill_normal, LINEAR_GAIN / math.sqrt(math.prod(shape[1:])), dtype)
    return TensorPlan(name, dtype, shape, fill)


def minicpmv4_6_tensor_plans(layout: Layout) -> list[TensorPlan]:
    """MiniCPM-V 4.6's tensors as MiniCPMV4_6ForConditionalGeneration names them: the Qwen3.5 text model's
    (drawn as the text model's) under `model.language_model.`, the tower and mergers as transformers has them."""
    from llmbuild.families.minicpmv4_6.synthetic import vision_shapes

    plans = [TensorPlan(p.name.replace("model.", "model.language_model.", 1), p.dtype, p.shape, p.fill)
             if p.name.startswith("model.") else p for p in hybrid_tensor_plans(layout)]
    config = {k: v for k, v in layout.config.items() if k != "llmbuild_truncated"}
    shapes = vision_shapes(config)
    plans += [siglip_plan(name, shapes[name], layout.model.float_dtype) for name in sorted(shapes)]
    return plans


# -hf name -> internvl_chat name, in order (transformers' convert_internvl_weights_to_hf.py, inverted).
_CHAT_NAMES = (
    ("vision_tower.", "vision_model."), (".encoder.layer.", ".encoder.layers."),
    (".embeddings.cls_token", ".embeddings.class_embedding"),
    (".embeddings.position_embeddings", ".embeddings.position_embedding"),
    (".patch_embeddings.projection.", ".patch_embedding."), (".lambda_1", ".ls1"), (".lambda_2", ".ls2"),
    (".attention.projection_layer.", ".attn.proj."), (".attention.", ".attn."),
    (".layernorm_before.", ".norm1."), (".layernorm_after.", ".norm2."),
    ("multi_modal_projector.layer_norm.", "mlp1.0."), ("multi_modal_projector.linear_1.", "mlp1.1."),
    ("multi_modal_projector.linear_2.", "mlp1.3."),
)  # fmt: skip
_QKV = ("q_proj", "k_proj", "v_proj")


def chat_tensor_plans(native: list[TensorPlan]) -> list[TensorPlan]:
    """The same tensors in the internvl_chat layout: renamed, each attention's q, k and v fused into
    attn.qkv (their rows in that order), every value drawn as in the -hf layout."""
    by_name = {p.name: p for p in native}
    plans = []
    for plan in native:
        name = plan.name
        for old, new in _CHAT_NAMES:
            name = name.replace(old, new)
        if any(f".attn.{proj}." in name for proj in _QKV[1:]):
            continue  # k and v go into q's fused tensor
        if ".attn.q_proj." in name:
            parts = tuple(by_name[plan.name.replace(".q_proj.", f".{proj}.")] for proj in _QKV)
            shape = (sum(p.shape[0] for p in parts), *plan.shape[1:])
            plans.append(TensorPlan(name.replace(".q_proj.", ".qkv."), plan.dtype, shape, None, parts))
        else:
            plans.append(TensorPlan(name, plan.dtype, plan.shape, None, (plan,)))
    return plans


def chat_config(layout: Layout) -> dict[str, Any]:
    """config.json of the internvl_chat layout (InternVLChatConfig, as OpenGVLab/InternVL3-2B has it) for the
    same model."""
    vision, text = layout.config["vision_config"], layout.text
    size, patch = vision["image_size"], vision["patch_size"]
    size, patch = (size[0] if isinstance(size, list) else size), (patch[0] if isinstance(patch, list) else patch)
    out = {
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "template": "internvl2_5",
        "downsample_ratio": layout.config["downsample_ratio"], "ps_version": "v2", "select_layer": -1,
        "force_image_size": size, "dynamic_image_size": True, "use_thumbnail": True, "max_dynamic_patch": 12,
        "min_dynamic_patch": 1, "pad2square": False, "use_backbone_lora": 0, "use_llm_lora": 0,
        "torch_dtype": layout.config.get("torch_dtype", "bfloat16"),
        "llm_config": dict(text) | {"_name_or_path": layout.model.extra.get("llm_name_or_path",
                                                                       "./pretrained/Qwen2.5-1.5B-Instruct"),
                                    "use_bfloat16": True},
        "vision_config": {
            "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b",
            "hidden_size": vision["hidden_size"], "intermediate_size": vision["intermediate_size"],
            "num_hidden_layers": vision["num_hidden_layers"], "num_attention_heads": vision["num_attention_heads"],
            "image_size": size, "patch_size": patch, "num_channels": vision.get("num_channels", 3),
            "qkv_bias": vision.get("attention_bias", False), "qk_normalization": vision.get("use_qk_norm", False),
            "norm_type": vision.get("norm_type", "layer_norm"), "layer_norm_eps": vision.get("layer_norm_eps", 1e-6),
            "hidden_act": vision.get("hidden_act", "gelu"), "initializer_factor": 0.1, "drop_path_rate": 0.0,
            "dropout": 0.0, "attention_dropout": 0.0, "use_flash_attn": True, "use_bfloat16": True,
        },
    }
    if "llmbuild_truncated" in layout.config:
        out["llmbuild_truncated"] = layout.config["llmbuild_truncated"]
    return out


def tensor_rng(seed: int, model_key: str, name: str) -> np.random.Generator:
    """A generator of its own per tensor, so a tensor's values depend on neither the file order nor the
    other tensors (a truncated variant has the full model's layers)."""
    digest = hashlib.sha256(f"{model_key}:{name}".encode()).digest()
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, int.from_bytes(digest[:16], "little")])))


# ---- safetensors, written as it is drawn -----------------------------------------------------------------


def file_order(plans: list[TensorPlan]) -> list[TensorPlan]:
    """The order the safetensors library lays tensors out in a file: descending dtype, then name."""
    return sorted(plans, key=lambda p: (-_DTYPE_RANK[p.dtype], p.name))


def safetensors_header(plans: list[TensorPlan]) -> bytes:
    """The 8-byte length plus the JSON header the safetensors library writes for these tensors, in order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for p in plans:
        header[p.name] = {"dtype": p.dtype, "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path: Path, plans: list[TensorPlan], rng_for: Callable[[str], np.random.Generator]) -> int:
    """Write one safetensors file block by block; return its size."""
    ordered = file_order(plans)
    header = safetensors_header(ordered)
    with path.open("wb") as f:
        f.write(header)
        for plan in ordered:
            written = 0
            for part in plan.parts or (plan,):
                assert part.fill is not None
                for block in part.fill(rng_for(part.name), part.shape):
                    f.write(np.ascontiguousarray(block).data)
                    written += block.nbytes
            if written != plan.nbytes:
                raise RuntimeError(f"{plan.name}: wrote {written} bytes, expected {plan.nbytes}")
        size = f.tell()
    if size != len(header) + sum(p.nbytes for p in plans):
        raise RuntimeError(f"{path}: size {size} does not match its header")
    return size


def shard(plans: list[TensorPlan], max_bytes: int | None) -> list[list[TensorPlan]]:
    """Split like huggingface_hub's split_state_dict_into_shards: start a new shard when the next tensor
    would overflow the current one."""
    if max_bytes is None:
        return [plans]
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for plan in plans:
        if shards[-1] and size + plan.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(plan)
        size += plan.nbytes
    return shards


def write_weights(directory: Path, layout: Layout, seed: int, chat: bool = False) -> None:
    if layout.model.key in HYBRID_MODELS:
        plans = hybrid_tensor_plans(layout)
    elif layout.model.key in HYBRID_VLM_MODELS:
        plans = minicpmv4_6_tensor_plans(layout)
    else:
        plans = tensor_plans(layout) if "text_config" not in layout.config else vlm_tensor_plans(layout)
    plans = chat_tensor_plans(plans) if chat else plans
    rng_for = partial(tensor_rng, seed, layout.model.key)
    shards = shard(plans, layout.model.shard_bytes)
    if len(shards) == 1:  # save_pretrained writes no index for a single shard (a truncated variant)
        write_safetensors(directory / "model.safetensors", plans, rng_for)
        return
    weight_map = {}
    for i, part in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(directory / name, part, rng_for)
        weight_map |= {p.name: name for p in part}
    index = {"metadata": {"total_size": sum(p.nbytes for p in plans)}, "weight_map": weight_map}
    write_json(directory / "model.safetensors.index.json", index)


# ---- tokenizer ----------------------------------------------------------------------------------------------


def _pipeline(tokenizer: Any, split: str, nfc: bool) -> None:
    """The published normalizer, pre-tokenizer and decoder (the post-processor is set once ids are known)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tokenizer.normalizer = normalizers.NFC() if nfc else None
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()


@cache
def trained_bpe(split: str, nfc: bool, size: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(tokens by id, merges) of a byte-level BPE of at most `size` tokens trained on the shipped corpus
    with the model's own pre-tokenizer. The trainer breaks count ties by pair order: deterministic."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    _pipeline(tokenizer, split, nfc)
    trainer = trainers.BpeTrainer(
        vocab_size=min(size, TRAIN_VOCAB_CAP), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    lines = [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    if [model["vocab"][t] for t in tokens] != list(range(len(tokens))):
        raise RuntimeError("trained BPE ids are not 0..n-1")
    merges = tuple(tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"])
    return tuple(tokens), merges


def filler(token_id: int) -> str:
    """A vocabulary entry BPE never produces: ⟨ and ⟩ lie outside the byte-level alphabet every input is
    mapped into, and no merge builds it. It decodes to itself."""
    return f"⟨filler{token_id}⟩"


def build_tokenizer(layout: Layout) -> Any:
    """The trained BPE padded with fillers to the published BPE size, then the specials at their ids."""
    from tokenizers import AddedToken, Tokenizer, models, processors

    style = layout.model.tokenizer
    tokens, merges = trained_bpe(style.split, style.nfc, layout.bpe_size)
    vocab = {t: i for i, t in enumerate(tokens)} | {filler(i): i for i in range(len(tokens), layout.bpe_size)}
    qwen_bpe = {"continuing_subword_prefix": "", "end_of_word_suffix": ""} if style.bos_prefix is None else {}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), dropout=None, fuse_unk=False,
                                     byte_fallback=False, ignore_merges=style.ignore_merges, **qwen_bpe))  # fmt: skip
    _pipeline(tokenizer, style.split, style.nfc)
    for i, s in enumerate(style.specials):
        added = AddedToken(s.content, special=s.special, normalized=False, lstrip=False, rstrip=False)
        (tokenizer.add_special_tokens if s.special else tokenizer.add_tokens)([added])
        landed = tokenizer.token_to_id(s.content)
        if landed != layout.bpe_size + i:
            raise RuntimeError(f"{s.content} landed at id {landed}, not {layout.bpe_size + i}")
    if style.bos_prefix is None:
        tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    else:
        bos = (style.bos_prefix, tokenizer.token_to_id(style.bos_prefix))
        template = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]}:1 $B:1", special_tokens=[bos]
        )
        if style.ignore_merges:  # Llama 3 runs a ByteLevel post-processor first
            template = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
        tokenizer.post_processor = template
    return tokenizer


def tokenizer_config(layout: Layout) -> dict[str, Any]:
    style = layout.model.tokenizer
    added = {
        str(layout.bpe_size + i): {"content": s.content, "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False, "special": s.special}
        for i, s in enumerate(style.specials)
    }  # fmt: skip
    return dict(style.config) | {"added_tokens_decoder": added, "chat_template": style.chat_template}


def generation_config(layout: Layout) -> dict[str, Any]:
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {k: layout.token_ids(v) if k in ids else v for k, v in layout.model.generation.items()}


# ---- one checkpoint directory -------------------------------------------------------------------------------


def stamp_for(layout: Layout, seed: int, overrides: Mapping[str, Any] | None, chat: bool = False) -> dict[str, Any]:
    """What makes the output: any difference means the directory on disk is not this checkpoint."""
    layout_key = {"vision_layout": "internvl_chat" if chat else "native"} if "text_config" in layout.config else {}
    return layout_key | {
        "generator": "benchmarks/make_checkpoint.py",
        "generator_version": GENERATOR_VERSION,
        "numpy": np.__version__,  # Generator streams may change between numpy versions
        "model": layout.model.key,
        "published": layout.model.repo,
        "seed": seed,
        "num_hidden_layers": layout.text["num_hidden_layers"],
        "vocab_size": layout.text["vocab_size"],
        "overrides": dict(overrides or {}),
    }


def is_current(directory: Path, stamp: Mapping[str, Any]) -> bool:
    """The directory holds exactly this checkpoint: same stamp, every file there at its recorded size."""
    try:
        found = json.loads((directory / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    files = found.pop("files", None)
    if found != dict(stamp) or not isinstance(files, dict):
        return False
    return all((directory / n).is_file() and (directory / n).stat().st_size == size for n, size in files.items())


def make_checkpoint(
    model_key: str, out_root: Path, seed: int = DEFAULT_SEED, layers: int | None = None,
    vocab_size: int | None = None, force: bool = False, overrides: Mapping[str, Any] | None = None,
    vision_layout: str = "native", vision_overrides: Mapping[str, Any] | None = None,
) -> tuple[Path, bool]:
    """Write `out_root`/<published directory name>; (its path, False when an up-to-date copy was kept).

    `overrides` replaces config.json fields (e.g. smaller hidden sizes, for tests); for a vision-language model
    they are its text model's, `vision_overrides` its vision_config's, and `vision_layout` "internvl_chat"
    writes InternVL's original layout (into the published original's directory name)."""
    if seed < 0:
        raise LlmbuildError(f"--seed must be >= 0, got {seed}")
    model = ALL_MODELS[model_key]
    if vision_layout not in ("native", "internvl_chat"):
        raise LlmbuildError(f"--vision-layout must be native or internvl_chat, got {vision_layout!r}")
    chat = vision_layout == "internvl_chat"
    vision_language = model_key in VLM_MODELS or model_key in HYBRID_VLM_MODELS
    if (chat and model.chat_directory is None) or (vision_overrides and not vision_language):
        raise LlmbuildError(f"--vision-layout and vision overrides apply to vision-language models, not {model_key}")
    layout = layout_for(model, layers, vocab_size, overrides)
    if vision_overrides:
        layout.config["vision_config"] = dict(layout.config["vision_config"]) | dict(vision_overrides)
        layout.config.setdefault("llmbuild_truncated", {})["vision_overrides"] = dict(vision_overrides)
    target = Path(out_root) / (model.chat_directory if chat and model.chat_directory else model.directory)
    stamp = stamp_for(layout, seed, overrides, chat) | ({"vision_overrides": dict(vision_overrides)}
                                                        if vision_overrides else {})
    if not force and is_current(target, stamp):
        return target, False
    if not force and target.exists() and not (target / STAMP_FILE).is_file():
        # Perhaps the real download: never replace what this script did not write.
        raise LlmbuildError(f"{target} exists and was not written by this script; pass --force to replace it")
    tokenizer = build_tokenizer(layout)
    with atomic_directory(target) as tmp:
        write_json(tmp / "config.json", chat_config(layout) if chat else layout.config)
        write_json(tmp / "generation_config.json", generation_config(layout))
        (tmp / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
        write_json(tmp / "tokenizer_config.json", tokenizer_config(layout))
        if "preprocessor_config" in model.extra:
            write_json(tmp / "preprocessor_config.json", model.extra["preprocessor_config"])
        write_weights(tmp, layout, seed, chat)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        write_json(tmp / STAMP_FILE, stamp | {"files": files})  # last: marks the directory complete
    return target, True


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=[*ALL_MODELS, "all"])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("LLMBUILD_MODELS") or ROOT / "models"),
                        help="folder for the checkpoint directories (default: $LLMBUILD_MODELS, else models/)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--layers", type=int, help="write only the first N layers (a truncated variant)")
    parser.add_argument("--vocab-size", type=int, help="a smaller vocabulary (a truncated variant)")
    parser.add_argument("--force", action="store_true", help="rewrite even an up-to-date or foreign directory")
    parser.add_argument("--vision-layout", choices=("native", "internvl_chat"), default="native",
                        help="a vision-language model's layout: transformers' native one (the -hf upload, default) "
                             "or InternVL's original internvl_chat one")
    args = parser.parse_args(argv)
    keys = list(ALL_MODELS) if args.model == "all" else [args.model]
    try:
        for key in keys:
            start = time.perf_counter()
            chat = args.vision_layout if key in VLM_MODELS else "native"
            path, written = make_checkpoint(key, args.out, args.seed, args.layers, args.vocab_size, args.force,
                                            vision_layout=chat)
            state = f"written in {time.perf_counter() - start:.1f} s" if written else "up to date, kept"
            print(f"{path}: {state}, {directory_bytes(path) / 2**30:.2f} GiB", flush=True)
    except LlmbuildError as exc:
        print(f"make_checkpoint: error: {exc}", file=sys.stderr)
        return 2
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    print(f"peak RSS {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
