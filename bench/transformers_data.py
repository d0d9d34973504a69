"""Inputs and models for the sentence-encoder rows of bench/fidelity.py; runs in the bench's torch venv.

Writes into OUT (bench/fidelity.py calls it once and reuses what it wrote):
  - mpnet.onnx: all-mpnet-base-v2 (safetensors from fetch_dev_models.sh) exported with torch at
    opset 17 (TorchScript exporter, eager attention), inputs input_ids/attention_mask [batch, seq],
    outputs token_embeddings [batch, seq, 768] and sentence_embedding (mean over the real tokens,
    sentence-transformers' pooling; its final Normalize is left out, cosine does not see it);
  - <model>/calib/NNNN.npz and <model>/eval/NNNN.npz for minilm and mpnet: one sentence each,
    keys = the model's inputs (int64 [1, SEQ], padded to SEQ), the `qtool calibrate --data` format;
    with --pack each input is consecutive sentences filling SEQ tokens instead (no padding);
  - sentences.json: the calibration and held-out sentences.
Sentences: English sentences from the docstrings of a fixed list of stdlib modules (this
interpreter's), filtered to plain prose, deduplicated and ordered by SHA-256; the first --calib
are the calibration set, the next --eval the held-out set (disjoint). Tokenizers: MPNet's own
tokenizer.json; MiniLM ships none, its vocabulary is bert-base-uncased's, which is MPNet's
vocab.txt without its 4 leading and 1 trailing special tokens, so its tokenizer is built here as
BertTokenizerFast builds it (BERT normalizer with lowercasing, BERT pre-tokenizer, WordPiece,
[CLS] $A [SEP]).

Usage (torch, transformers, tokenizers in the running interpreter):
  python bench/transformers_data.py OUT [--dev ~/.cache/qtool-dev] [--calib 128] [--eval 128] [--seq 64] [--pack]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import re
import sys
from pathlib import Path

import numpy as np

MODULES = (
    "abc argparse ast asyncio base64 bisect bz2 calendar cmd codecs collections colorsys configparser contextlib copy "
    "csv dataclasses datetime decimal difflib dis doctest email.message enum filecmp fnmatch fractions ftplib functools "
    "getopt gettext glob gzip hashlib heapq hmac html.parser http.client http.cookies imaplib inspect io ipaddress "
    "itertools json locale logging lzma mailbox mimetypes netrc numbers operator optparse os pathlib pdb pickle pkgutil "
    "platform poplib pprint profile pstats queue quopri random re reprlib sched secrets selectors shelve shlex shutil "
    "smtplib socket socketserver sqlite3 ssl statistics string struct subprocess symtable tarfile tempfile textwrap "
    "threading timeit tokenize trace traceback types typing unittest urllib.parse urllib.request uuid warnings wave "
    "weakref webbrowser xml.dom.minidom xml.etree.ElementTree zipfile"
).split()
SPLIT = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
PROSE = re.compile(r"^[A-Z][A-Za-z ,;:'\-()]+[a-z][.!?]$")


def _docstrings() -> list[str]:
    docs = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # a module this interpreter lacks is skipped
            continue
        docs.append(inspect.getdoc(mod) or "")
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == mod.__name__:
                docs.append(inspect.getdoc(obj) or "")
                if inspect.isclass(obj):
                    docs.extend(inspect.getdoc(m) or "" for _, m in sorted(vars(obj).items()) if inspect.isfunction(m))
    return docs


def sentences() -> list[str]:
    """Plain English sentences from the stdlib's docstrings, deduplicated, in SHA-256 order."""
    found = set()
    for doc in _docstrings():
        for para in re.split(r"\n\s*\n", doc):
            lines = para.splitlines()
            if not lines or any(x.startswith((" ", "\t", ">>>", "...")) for x in lines):
                continue  # code, examples, indented lists
            for s in SPLIT.split(" ".join(x.strip() for x in lines)):
                if 8 <= len(s.split()) <= 40 and PROSE.match(s):
                    found.add(s)
    return sorted(found, key=lambda s: hashlib.sha256(s.encode()).hexdigest())


def minilm_tokenizer(vocab_txt: Path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tokens = vocab_txt.read_text(encoding="utf-8").splitlines()
    assert tokens[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and tokens[-1] == "<mask>", "not MPNet's vocab.txt"
    vocab = {t: i for i, t in enumerate(tokens[4:-1])}
    assert len(vocab) == 30522 and vocab["[CLS]"] == 101 and vocab["[SEP]"] == 102
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 101), ("[SEP]", 102)])
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def mpnet_tokenizer(tokenizer_json: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_padding(pad_id=tok.token_to_id("<pad>"), pad_token="<pad>")
    return tok


def packed(tok, texts: list[str], count: int, seq: int) -> tuple[list[str], list[str]]:
    """`count` inputs of consecutive sentences joined until they fill `seq` tokens (truncated there),
    and the sentences left over."""
    tok.no_truncation()  # MPNet's tokenizer.json truncates at 128
    inputs, k = [], 0
    for _ in range(count):
        joined = ""
        while len(tok.encode(joined).ids) < seq:
            if k == len(texts):
                sys.exit(f"not enough sentences to fill {count} inputs of {seq} tokens")
            joined += (" " if joined else "") + texts[k]
            k += 1
        inputs.append(joined)
    return inputs, texts[k:]


def write_sets(tok, out: Path, calib: list[str], held: list[str], seq: int) -> None:
    tok.enable_truncation(seq)
    tok.enable_padding(pad_id=tok.padding["pad_id"], pad_token=tok.padding["pad_token"], length=seq)
    for folder, texts in (("calib", calib), ("eval", held)):
        d = out / folder
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.npz"):
            old.unlink()
        for i, enc in enumerate(tok.encode_batch(texts)):
            np.savez(d / f"{i:04d}.npz", input_ids=np.array([enc.ids], np.int64),
                     attention_mask=np.array([enc.attention_mask], np.int64))


def export_mpnet(weights: Path, path: Path) -> None:
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(weights), attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            h = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return h, (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers' mean pooling

    ids = torch.ones(2, 16, dtype=torch.int64)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(Encoder().eval(), (ids, torch.ones_like(ids)), str(tmp), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["token_embeddings", "sentence_embedding"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                        "token_embeddings": {0: "batch", 1: "seq"}, "sentence_embedding": {0: "batch"}})
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev")
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--pack", action="store_true", help="fill each input with consecutive sentences up to --seq tokens (no padding)")
    args = ap.parse_args()
    weights = args.dev / "weights" / "all-mpnet-base-v2"
    args.out.mkdir(parents=True, exist_ok=True)
    texts = sentences()
    if len(texts) < args.calib + args.eval:
        sys.exit(f"only {len(texts)} sentences for --calib {args.calib} + --eval {args.eval}")
    calib, held = texts[:args.calib], texts[args.calib:args.calib + args.eval]
    for name, tok in (("minilm", minilm_tokenizer(weights / "vocab.txt")), ("mpnet", mpnet_tokenizer(weights / "tokenizer.json"))):
        if args.pack:  # every input full: attention spread over --seq real tokens
            calib, rest = packed(tok, texts, args.calib, args.seq)
            held, _ = packed(tok, rest, args.eval, args.seq)
        write_sets(tok, args.out / name, calib, held, args.seq)
    if not (args.out / "mpnet.onnx").exists():
        export_mpnet(weights, args.out / "mpnet.onnx")
    (args.out / "sentences.json").write_text(json.dumps({"python": sys.version.split()[0], "available": len(texts),
                                                         "calib": calib, "eval": held}, indent=1))


if __name__ == "__main__":
    main()
