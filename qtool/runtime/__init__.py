"""Running a model: every onnxruntime session and OpenVINO compile qtool makes, made here.

onnxruntime.py: the session factory (CPU provider, log level, threads, graph optimization level,
weights on disk or in big models' lazy store) and running a session with one-line errors; the
onnxruntime log level of the process (quiet). openvino.py: OpenVINO's CPU plugin behind the same
`run(names, feeds)`, with its float precision stated. nchwc.py: onnxruntime's blocked (NCHWc)
layout, and the session that fetches convolution outputs before the reorder to NCHW.

Collection, the targets and the checks all run models through this layer; it sits just above
qtool.model (it reads the model's weights where they lie) and below everything that runs one.
"""
