"""`qtool inspect`: what a calibration file or a target's range file holds and what it covers, the
rules of a target a Q/DQ model breaks (its check option, qtool.targets.inspect_checks), or the
policy each quantizer gets."""

from __future__ import annotations

from pathlib import Path

from .. import inspection, provenance, targets
from ..errors import Opt, QtoolError, UsageError
from ..options import declared_options
from ..results import InspectResult
from ..targets.cpu import PolicyFlags
from . import path


def run(file, *, model=None, policies: PolicyFlags | None = None, **checks) -> InspectResult:
    """What `file` holds (a calibration file or a target's range file, told apart by content), with
    `model` the activation tensors of that model it covers; with a target's check option (`checks`:
    its key, e.g. trt_version, and value), `file` is a Q/DQ ONNX model checked against that
    target's rules; with policy flags (as export's), each quantizer of the calibration's model and
    its policy. A missing range, an unusable scale or a broken rule is the result's failure."""
    file, model_path = Path(file), path(model)
    owners = {key: name for name, cls in targets.inspect_checks().items() for key in declared_options(cls)}
    unknown = sorted(set(checks) - set(owners))
    if unknown:
        raise QtoolError("unknown option {option}: it takes {known}", option=Opt(unknown[0]), known=", ".join(sorted(owners)))
    given = {k: v for k, v in checks.items() if v is not None}
    if policies is not None and policies.given():
        if given or model_path is not None:
            raise UsageError("the policy options go with a calibration file alone (not with {check} or {model})",
                             check=Opt(next(iter(given), next(iter(owners)))), model=Opt("model"))
        return inspection.inspect_policies(file, policies.policies())
    if given:
        key, value = next(iter(given.items()))
        if model_path is not None:
            raise UsageError("{check} checks the ONNX model given as FILE; it does not go with {model}", check=Opt(key), model=Opt("model"))
        value = targets.get(owners[key]).inspection().checked(value)
        if not inspection.is_onnx_file(file):  # missing or unreadable: bad input; another kind of file: a usage error
            raise UsageError("{check} checks an ONNX model's Q/DQ nodes, and {file!r} is not an ONNX model",
                             check=Opt(key), file=str(file))
        return inspection.inspect_onnx(file, owners[key], value)
    recorded = _recorded_check(file, owners) if model_path is None else None
    if recorded is not None:
        return inspection.inspect_onnx(file, *recorded)
    return inspection.inspect_file(file, model_path)


def _recorded_check(file: Path, owners: dict[str, str]) -> tuple[str, str] | None:
    """(target, value) of the check the ONNX file `file` was written for, when qtool exported it and recorded that
    target's check option (the target version its file was made for); None for any other file."""
    if not file.is_file():
        return None
    try:
        header = provenance.header(file)  # without the weights
    except QtoolError:  # not an ONNX model: a calibration or range file, which inspect_file reads
        return None
    found = provenance.read(header, file)
    for key, target in owners.items():
        if found is not None and found.target == target and found.options.get(key):
            return target, targets.get(target).inspection().checked(str(found.options[key]))
    return None
