"""Build, offline and deterministically, the model the vLLM e2e suite serves, and the tokenizer
directories epp is given for it. Runs in the vLLM venv (it needs torch and transformers):

    .venv-vllm/bin/python e2e/vllm/build_model.py OUT_DIR

What is built, under OUT_DIR:

- `model/`: a random-weight `LlamaForCausalLM` (seed 0, bfloat16, 2 layers, hidden 128, 4 heads of
  32, vocabulary 8,256) with epp-tiny's tokenizer (epp/tokenize/data) plus the control tokens of the
  chat-template styles under e2e/vllm/templates (Llama-3 header ids, ChatML, Mistral's [INST] and
  tool tokens), appended after epp-tiny's 8,192 ids. Text that contains none of those strings
  tokenizes exactly as epp-tiny does (added tokens are split off before the BPE runs), so an epp
  started with no --tokenizer at all tokenizes the routing tests' prompts as this model does. The
  default chat template is epp-tiny's own.
- `tokenizers/<style>/`: the same tokenizer.json with one template as its chat template, for
  `epp serve --tokenizer <style>=<dir>`; vLLM serves the style names as aliases of the model and
  gets the same template with each request (`chat_template`, with --trust-request-chat-template).

Random weights make the model's output noise, which is all the suite needs: it looks at prompt
token ids, KV-cache blocks and counters, never at what the model says. Building twice gives
byte-identical files (seeded init, sorted JSON).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPP_TINY = HERE.parent.parent / "epp" / "tokenize" / "data"
TEMPLATES = HERE / "templates"
VOCAB_SIZE = 8256  # epp-tiny's 8,192 ids + the added tokens below, rounded up to a multiple of 64
# Added after epp-tiny's ids, in this order. `<tool_call>`/`</tool_call>` are added but not
# special (as in Qwen's tokenizers): both kinds are split off before the BPE runs.
SPECIAL = [
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|im_start|>",
    "<|im_end|>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
ADDED = ["<tool_call>", "</tool_call>"]


def styles() -> dict[str, str]:
    """Style name (the served alias) -> chat template source."""
    return {p.stem.replace("_", "-"): p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))}


def build_tokenizer(out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(EPP_TINY / "tokenizer.json"))
    base = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    assert tok.token_to_id(SPECIAL[0]) == base, "added ids must follow epp-tiny's"
    assert tok.get_vocab_size(with_added_tokens=True) <= VOCAB_SIZE
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = json.loads((EPP_TINY / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = [*config.get("additional_special_tokens", []), *SPECIAL]
    _dump(out / "tokenizer_config.json", config)
    shutil.copyfile(EPP_TINY / "special_tokens_map.json", out / "special_tokens_map.json")


def build_model(out: Path) -> None:
    import torch  # type: ignore[import-not-found]  # only in the vLLM venv
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def main(out: Path) -> None:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tokenizer(tmp / "model")
    build_model(tmp / "model")
    for name, template in styles().items():
        d = tmp / "tokenizers" / name
        d.mkdir(parents=True)
        shutil.copyfile(tmp / "model" / "tokenizer.json", d / "tokenizer.json")
        shutil.copyfile(tmp / "model" / "special_tokens_map.json", d / "special_tokens_map.json")
        config = json.loads((tmp / "model" / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        _dump(d / "tokenizer_config.json", config)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # complete or absent: a killed build leaves only the .partial directory


def _dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
