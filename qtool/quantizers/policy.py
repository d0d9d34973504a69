"""Quantization policy: one small record per quantizer, and the rules that choose it.

A `Policy` says how one tensor is quantized (PPQ's TensorQuantizationConfig, OpenPPL/ppq
ppq/core/quant.py, reduced to what a runtime can run): bits, signed or unsigned grid, symmetric or
asymmetric, per tensor or per channel, a float or power-of-two scale, and the rounding. It is the
single source of the integer grid (quant_min/quant_max), the scale and the zero point: placement
attaches one to every quantizer and the exporters and evaluate read it.

    grid     signed [-2^(b-1), 2^(b-1)-1] (weights: narrow, [-2^(b-1)+1, 2^(b-1)-1]) or unsigned
             [0, 2^b-1]; `signed=None` lets an activation take the unsigned grid when it is never
             negative (qtool's default), weights are always signed;
    scale    symmetric: amax / qmax; asymmetric: (high - low) / (qmax - qmin) over the clipped
             [low, high] with the zero point rounded onto the grid and the range moved to put
             zero exactly on it; pow2: the next power of two up (never clips more than the float
             scale: a larger step, the same or a wider range);
    rounding half-even (ONNX QuantizeLinear, OpenVINO FakeQuantize), half-up, half-down,
             half-away (from zero), toward-zero, up, down. Weights are quantized by qtool with the
             policy's rounding; activations are rounded by the runtime (half-even in ONNX and
             OpenVINO), so other modes apply to weights and to the numpy simulation.

Choosing: `Policies` holds the default policies (activations, weights) and rules applied in order
(later rules win), each matching a node or tensor by exact name, glob, regex or op type and
setting some fields. A rule file is JSON or TOML (see `load_rules`).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from ..calibration import decide, nesting_depth, read_input
from ..errors import Opt, QtoolError
from . import grids

ROUNDINGS = ("half-even", "half-up", "half-down", "half-away", "toward-zero", "up", "down")
SCALES = ("float", "pow2")
MIN_BITS, MAX_BITS = 2, 16  # runtimes: 4-bit and 8-bit weights, 8- and 16-bit activations


def round_values(x: np.ndarray, mode: str) -> np.ndarray:
    """x rounded to integers by `mode` (float64 in, float64 out)."""
    x = np.asarray(x, dtype=np.float64)
    if mode == "half-even":
        return np.rint(x)
    if mode == "half-up":
        return np.floor(x + 0.5)
    if mode == "half-down":
        return np.ceil(x - 0.5)
    if mode == "half-away":
        return np.sign(x) * np.floor(np.abs(x) + 0.5)
    if mode == "toward-zero":
        return np.trunc(x)
    if mode == "up":
        return np.ceil(x)
    if mode == "down":
        return np.floor(x)
    raise ValueError(f"unknown rounding {mode!r}")


def pow2_scale(scale: np.ndarray) -> np.ndarray:
    """The smallest power of two >= scale, element-wise (exact in float32 and float16 ranges)."""
    s = np.asarray(scale, dtype=np.float64)
    return np.exp2(np.ceil(np.log2(s)))


@dataclass(frozen=True)
class Policy:
    bits: int = 8
    signed: bool | None = None  # None: unsigned when never negative (activations); weights are signed
    symmetric: bool | None = True  # None (activations): per tensor whichever grid quantizes finer (`choose_symmetry`)
    per_channel: bool = False
    scale: str = "float"
    rounding: str = "half-even"

    def __post_init__(self):
        if not (isinstance(self.bits, int) and MIN_BITS <= self.bits <= MAX_BITS):
            raise QtoolError(f"bits must be an integer from {MIN_BITS} to {MAX_BITS}, not {self.bits!r}")
        if self.scale not in SCALES:
            raise QtoolError(f"scale must be one of {', '.join(SCALES)}, not {self.scale!r}")
        if self.rounding not in ROUNDINGS:
            raise QtoolError(f"rounding must be one of {', '.join(ROUNDINGS)}, not {self.rounding!r}")

    def describe(self) -> str:
        sign = {None: "auto", True: "signed", False: "unsigned"}[self.signed]
        symmetry = {None: "auto-symmetric", True: "symmetric", False: "asymmetric"}[self.symmetric]
        return (f"{self.bits}-bit {sign} {symmetry} "
                f"{'per-channel' if self.per_channel else 'per-tensor'} {self.scale} scale, {self.rounding}")

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# The default activation policy of the OpenVINO and QDQ exports: per tensor the finer of the
# symmetric and asymmetric grids (bench/fidelity.py: better than symmetric on 7 of the 8 real models)
ACTIVATIONS = Policy(symmetric=None)
SYMMETRIC = Policy()  # what a quantizer gets without policies (targets that take symmetric grids only)
WEIGHTS = Policy(signed=True, per_channel=True)


def _scaled(scale: np.ndarray, policy: Policy) -> np.ndarray:
    return pow2_scale(scale) if policy.scale == "pow2" else np.asarray(scale, dtype=np.float64)


def activation_params(amax, unsigned: bool, policy: Policy = SYMMETRIC, low=None, high=None, axis: int | None = None) -> grids.QParams:
    """The quantizer of an activation with threshold `amax` (> 0; per channel along `axis` when an array):
    symmetric on [0, amax] (unsigned) or [-amax * (qmax+1)/qmax, amax]; asymmetric on the
    calibrated [low, high] clipped to [-amax, amax], zero exactly on the grid."""
    asymmetric = policy.symmetric is False and low is not None and high is not None
    # asymmetric: an unsigned grid with a zero point (u8 in OpenVINO and onnxruntime), unless told otherwise
    signed = (not unsigned and not asymmetric) if policy.signed is None else policy.signed
    g = grids.grid(policy.bits, signed=signed)
    a = np.asarray(amax, dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(a > 0)):
        raise ValueError(f"amax must be finite and > 0, got {amax}")
    if not asymmetric:
        scale = _scaled(a / g.qmax, policy)
        return grids.QParams(scale, np.zeros(a.shape, dtype=np.int64), g, axis if a.ndim else None)
    lo = np.minimum(np.maximum(np.asarray(low, np.float64), -a), 0.0)  # the range holds zero
    hi = np.maximum(np.minimum(np.asarray(high, np.float64), a), 0.0)
    hi = np.where(hi - lo > 0, hi, a)
    scale = _scaled((hi - lo) / (g.qmax - g.qmin), policy)
    zp = np.clip(np.rint(g.qmin - lo / scale), g.qmin, g.qmax).astype(np.int64)
    return grids.QParams(scale, zp, g, axis if a.ndim else None)


def seven_bit_codes(params: grids.QParams) -> grids.QParams:
    """The per-tensor 8-bit activation quantizer `params` moved onto an unsigned grid whose stored
    codes of its range [input_low, input_high] are 0..127 (a zero point, twice the step): the
    overflow guard's input remedy (qtool.quantizers.placement.guard), with which no u8 x s8 pair
    can pass int16 (2 x 128 x 127 < 32767) whatever the weights."""
    lo, hi = (float(v) for v in grids.range_from_scale(params.scale, params.zero_point, params.grid))
    g = grids.grid(8, signed=False)
    scale = (hi - lo) / 127
    zp = int(np.clip(np.rint(-lo / scale), g.qmin, g.qmax))
    return grids.QParams(np.asarray(scale, dtype=np.float64), np.asarray(zp, dtype=np.int64), g, None)


# Asymmetric activations take a zero point; `symmetric=None` chooses them only where the step
# shrinks by at least this factor (a tensor whose negative side is short, e.g. a SiLU output).
ASYMMETRIC_GAIN = 0.9


def choose_symmetry(amax: float, low: float, high: float, bits: int = 8) -> bool:
    """True (symmetric) or False (asymmetric) for an activation with threshold `amax` and
    calibrated range [low, high]: both grids clip the same values (|x| > amax), so the one with the
    smaller step quantizes with less error; asymmetric wins when its step is at most
    ASYMMETRIC_GAIN of the symmetric one. Never-negative tensors stay symmetric (already [0, amax])."""
    if low >= 0 or not (amax > 0):
        return True
    sym_step = amax / (2 ** (bits - 1) - 1)
    asym_step = (min(high, amax) - max(low, -amax)) / (2 ** bits - 1)
    return not asym_step <= ASYMMETRIC_GAIN * sym_step


def weight_params(w, axis: int | None, policy: Policy = WEIGHTS, headroom_bits: int = 0, floor=None) -> grids.QParams:
    """Symmetric narrow-range weight quantizer from the weights (per channel along `axis`).
    headroom_bits: scale amax / (qmax >> headroom) on the same exported grid (NNCF's 7-bit
    overflow fix is 8 bits with one bit of headroom). floor: a smallest amax (per channel), e.g.
    the overflow guard's (qtool.quantizers.overflow.pair_step)."""
    wa = np.abs(np.asarray(w, dtype=np.float64))
    if not np.all(np.isfinite(wa)):
        raise ValueError("weights contain NaN or infinity")
    if axis is None:
        amax = np.asarray(wa.max() if wa.size else 0.0)
    else:
        axis = axis % wa.ndim
        amax = wa.max(axis=tuple(i for i in range(wa.ndim) if i != axis)) if wa.size else np.zeros(wa.shape[axis])
    fallback = float(amax.max()) if amax.size and amax.max() > grids.MIN_WEIGHT_AMAX else 1.0
    amax = np.where(amax > grids.MIN_WEIGHT_AMAX, amax, fallback)
    if floor is not None:
        amax = np.maximum(amax, np.asarray(floor, dtype=np.float64) if axis is not None else np.max(floor))
    g = grids.grid(policy.bits, signed=True, narrow=True)
    used = g.qmax >> headroom_bits
    return grids.QParams(_scaled(amax / used, policy), np.zeros(amax.shape, dtype=np.int64), g, axis)


def quantize(x, params: grids.QParams, rounding: str = "half-even") -> np.ndarray:
    """clip(round(x / scale) + zp, qmin, qmax) as int64, rounded by `rounding` (axis: per channel)."""
    return grids.quantize_linear(x, params.scale, params.zero_point, params.grid, params.axis,
                                 round_fn=lambda t: round_values(t, rounding))


def fake_quantize(x, params: grids.QParams, rounding: str = "half-even") -> np.ndarray:
    """x through the quantizer and back (float64): the numpy simulation of any policy."""
    q = quantize(x, params, rounding)
    return grids.dequantize_linear(q, params.scale, params.zero_point, params.axis if np.ndim(params.scale) else None)


# ---------------------------------------------------------------- choosing policies

_MATCHERS = ("name", "glob", "regex", "op_type")
_FIELDS = {f.name for f in fields(Policy)}
_KINDS = ("activations", "weights")


@dataclass(frozen=True)
class Rule:
    """Set `changes` on the policies of `kinds` quantizers whose node or tensor matches."""

    match: str  # one of _MATCHERS
    pattern: str
    changes: dict
    kinds: tuple[str, ...] = _KINDS
    where: str = ""  # for messages: "rule 3 of policy.json"

    def matches(self, names: list[str], op_types: list[str]) -> bool:
        if self.match == "op_type":
            return self.pattern in op_types
        if self.match == "name":
            return self.pattern in names
        if self.match == "glob":
            return any(fnmatch.fnmatchcase(n, self.pattern) for n in names)
        for n in names:
            if len(n) ** (regex_repeats(self.pattern) + 1) > REGEX_BUDGET:
                raise QtoolError(f"{self.where}: regex {self.pattern[:80]!r} could take too long on the {len(n)}-character name "
                                 f"{n[:60]!r}... (each repeating quantifier multiplies the work by the name's length); "
                                 "use fewer of them, or a glob rule")
            if re.search(self.pattern, n):
                return True
        return False


# Limits on a rule file: its size, how deeply it nests, a pattern's length. Python's `re` has no
# timeout, so regex rules take a subset that cannot backtrack without bound (`check_regex`), and
# a search whose worst case, name length ** (repeating quantifiers + 1), exceeds REGEX_BUDGET
# (a few seconds) is refused: 3 repeats go up to 250-character names, 2 up to 1500.
MAX_POLICY_BYTES = 16 << 20
MAX_POLICY_DEPTH = 16
MAX_PATTERN = 1000
REGEX_BUDGET = 4e9
MAX_REPEATS = 3  # quantifiers that repeat without a small bound (*, +, {m,} and {m,n} with n > 64)
MAX_QUANTIFIERS = 12  # all quantifiers, ? included


def check_regex(pattern: str) -> str | None:
    return _regex_cost(pattern)[0]


def regex_repeats(pattern: str) -> int:
    """The quantifiers of a regex that repeat without a small bound (*, +, {m,}, {m,n} with n > 64)."""
    return _regex_cost(pattern)[1]


@functools.lru_cache(maxsize=256)
def _regex_cost(pattern: str) -> tuple[str | None, int]:
    """Why a rule's regex could take unbounded time, or None. Refused: a quantifier applied to
    something that itself holds a quantifier or an alternation (`(a+)+`, `(a|ab)*`), back
    references, and more than MAX_REPEATS repeating quantifiers (`.*a.*b.*c.*d` is polynomial
    in the name length with a degree that grows with each one)."""
    try:
        import re._parser as sre_parse  # Python >= 3.11
        from re._constants import MAXREPEAT
    except ImportError:  # Python 3.10
        import sre_parse
        from sre_constants import MAXREPEAT
    if len(pattern) > MAX_PATTERN:
        return f"longer than {MAX_PATTERN} characters", 0
    tree = sre_parse.parse(pattern)
    repeats = quantifiers = 0

    def walk(items, inside_repeat: bool) -> str | None:
        nonlocal repeats, quantifiers
        for op, av in items:
            name = str(op)
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "back references are not supported"
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, body = av
                many = high is MAXREPEAT or high > 1
                if inside_repeat:
                    return "a quantifier inside a repeated group (e.g. (a+)+) can take exponential time"
                repeats += high is MAXREPEAT or high > 64  # a short bounded repeat multiplies the work by its bound, not the name length
                quantifiers += 1
                found = walk(body, many)
            elif name == "BRANCH":
                if inside_repeat:
                    return "an alternation inside a repeated group (e.g. (a|ab)*) can take exponential time; use a character class"
                found = next((f for f in (walk(b, inside_repeat) for b in av[1]) if f), None)
            elif name == "SUBPATTERN":
                found = walk(av[-1], inside_repeat)
            elif name in ("ASSERT", "ASSERT_NOT"):
                found = walk(av[1], inside_repeat)
            elif name == "ATOMIC_GROUP":
                found = walk(av, inside_repeat)
            else:
                found = None
            if found:
                return found
        return None

    found = walk(tree, False)
    if not found and quantifiers > MAX_QUANTIFIERS:
        found = f"more than {MAX_QUANTIFIERS} quantifiers (a?a?a?... backtracks 2**n ways)"
    if not found and repeats > MAX_REPEATS:
        found = f"more than {MAX_REPEATS} repeating quantifiers (*, +, {{m,n}}); use a glob rule or fewer .*"
    return found, repeats


@dataclass
class Policies:
    """Default policies plus rules (later wins); `for_quantizer` resolves one quantizer."""

    activations: Policy = ACTIVATIONS
    weights: Policy = WEIGHTS
    rules: list[Rule] = field(default_factory=list)
    used: set = field(default_factory=set, compare=False)  # indexes of rules that matched something (bookkeeping, not the policy)

    def for_quantizer(self, kind: str, tensor: str, nodes: list[str], op_types: list[str]) -> Policy:
        """The policy of the `kind` ("activations"/"weights") quantizer on `tensor`, read by `nodes`."""
        policy = self.activations if kind == "activations" else self.weights
        for i, rule in enumerate(self.rules):
            if kind in rule.kinds and rule.matches([tensor, *nodes], op_types):
                self.used.add(i)
                try:
                    policy = replace(policy, **rule.changes)
                except TypeError as e:
                    raise QtoolError(f"{rule.where}: {e}") from None
        return policy

    def unused(self) -> list[str]:
        return [f"{r.where} ({r.match} {r.pattern!r}) matches no quantizer" for i, r in enumerate(self.rules) if i not in self.used]


def _parse_rule(item, where: str) -> Rule:
    if not isinstance(item, dict):
        raise QtoolError(f"{where} must be a table/object with one of {', '.join(_MATCHERS)} and policy fields")
    unknown = sorted(set(item) - set(_MATCHERS) - _FIELDS - {"apply_to"})
    if unknown:
        raise QtoolError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(_MATCHERS + tuple(sorted(_FIELDS)))}, apply_to)")
    matchers = [k for k in _MATCHERS if k in item]
    if len(matchers) != 1:
        raise QtoolError(f"{where} needs exactly one of {', '.join(_MATCHERS)}")
    kinds = item.get("apply_to", list(_KINDS))
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds) if isinstance(kinds, list) else ()
    if not kinds or any(k not in _KINDS for k in kinds):
        raise QtoolError(f"{where}: apply_to must be activations, weights or both")
    value = item[matchers[0]]
    if isinstance(value, (list, dict)) or value is None:
        raise QtoolError(f"{where}: {matchers[0]} must be text, not {type(value).__name__}")
    pattern = str(value)
    if len(pattern) > MAX_PATTERN:
        raise QtoolError(f"{where}: {matchers[0]} is longer than {MAX_PATTERN} characters")
    if matchers[0] == "regex":
        try:
            re.compile(pattern)
            unsafe = check_regex(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            raise QtoolError(f"{where}: bad regex {pattern[:80]!r} ({e if not isinstance(e, RecursionError) else 'nested too deeply'})") from None
        if unsafe:
            raise QtoolError(f"{where}: regex {pattern[:80]!r} refused: {unsafe}")
    changes = {k: item[k] for k in _FIELDS if k in item}
    for k in ("signed", "symmetric", "per_channel"):
        if k in changes and not (isinstance(changes[k], bool) or (changes[k] is None and k != "per_channel")):
            raise QtoolError(f"{where}: {k} must be true or false, not {changes[k]!r}"[:200])
    for k in ("scale", "rounding"):
        if k in changes and not isinstance(changes[k], str):
            raise QtoolError(f"{where}: {k} must be text, not {type(changes[k]).__name__}")
    if "bits" in changes and (isinstance(changes["bits"], bool) or not isinstance(changes["bits"], int)):
        raise QtoolError(f"{where}: bits must be an integer from {MIN_BITS} to {MAX_BITS}")
    try:
        replace(ACTIVATIONS, **changes)  # validates the values now, with the rule's name in the message
    except QtoolError as e:
        raise QtoolError(f"{where}: {e}") from None
    return Rule(matchers[0], pattern, changes, kinds, where)


def load_rules(path: Path) -> list[Rule]:
    """Rules from a JSON file ({"rules": [...]}) or TOML file ([[rules]] tables). Each rule has one
    matcher (name, glob, regex or op_type), optional apply_to (activations/weights) and the policy
    fields it sets (bits, signed, symmetric, per_channel, scale, rounding)."""
    kind = "TOML" if str(path).endswith(".toml") else "JSON"
    named = {"policy": Opt("policy", str(path), quoted=True)}
    data = read_input(path, MAX_POLICY_BYTES, Opt("policy"))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise QtoolError("{policy} is not UTF-8 text (byte {at}: 0x{byte:02x}); save it as UTF-8", at=e.start, byte=data[e.start],
                         **named) from None
    try:
        if kind == "TOML":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                raise QtoolError("{policy}: TOML files need Python 3.11; use a JSON file", policy=Opt("policy")) from None
            doc = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except RecursionError:
        raise QtoolError("{policy} is not valid {kind} (nested too deeply)", kind=kind, **named) from None
    except (ValueError, TypeError) as e:
        raise QtoolError("{policy} is not valid {kind} ({why})", kind=kind, why=str(e)[:200], **named) from None
    if nesting_depth(doc, MAX_POLICY_DEPTH) > MAX_POLICY_DEPTH:
        raise QtoolError("{policy} nests deeper than {most} levels; a rule file is a list of flat rules", most=MAX_POLICY_DEPTH, **named)
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list) or set(doc) - {"rules"}:
        unknown = sorted(set(doc) - {"rules"}) if isinstance(doc, dict) else "-"
        raise QtoolError("{policy} must hold one list named rules (unknown keys: {unknown})", unknown=unknown, **named)
    return [_parse_rule(item, f"rule {i + 1} of {Path(path).name}") for i, item in enumerate(doc["rules"])]


ACTIVATION_MODES = {"symmetric": True, "asymmetric": False, "auto": None}


def from_options(weight_bits: int | None = None, activation_bits: int | None = None, scale: str | None = None,
                 rounding: str | None = None, rules: list[Rule] | None = None, activations: str | None = None) -> Policies:
    """Policies from the whole-model options and a rule list (activations: symmetric, asymmetric or auto)."""
    common = {k: v for k, v in (("scale", scale), ("rounding", rounding)) if v is not None}
    acts = replace(ACTIVATIONS, **common, **({"bits": activation_bits} if activation_bits else {}),
                   **({"symmetric": ACTIVATION_MODES[activations]} if activations else {}))
    wts = replace(WEIGHTS, **common, **({"bits": weight_bits} if weight_bits else {}))
    return Policies(acts, wts, list(rules or []))


def is_pow2(x) -> bool:
    """Every element an exact power of two."""
    m, _ = np.frexp(np.asarray(x, dtype=np.float64))
    return bool(np.all(m == 0.5))


def searcher(cal, method: str | None = None):
    """recompute(tensor, policy) -> amax: `method` (default: the calibration's) searched again on
    the policy's grid (its bits, signed unless the tensor is never negative), with the clipping fallback."""
    records = {t.name: t for t in cal.tensors}

    def recompute(tensor: str, policy: Policy) -> float:
        return decide(records[tensor], signed=policy.signed is True, method=method or cal.method, kl_variant=cal.kl_variant,
                      num_bits=policy.bits).amax

    return recompute


def runtime_rounding_warnings(plan, runtime: str) -> list[str]:
    """Activations whose policy rounds otherwise than half to even: the runtime rounds them half to even."""
    odd = sorted({s.policy.rounding for s in plan.activations if s.policy.rounding != "half-even"})
    if not odd:
        return []
    return [f"{runtime} rounds activations half to even; --rounding {', '.join(odd)} applies to the weights and to the "
            "numpy simulation (qtool.quantizers.policy.fake_quantize) only"]
