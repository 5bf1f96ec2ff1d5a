"""Exceptions raised by cuvil-edge.

Every error a user can cause derives from :class:`CuvilEdgeError`, so the CLI turns it into one line
and exit code 1. Our own bugs raise :class:`InternalError`, outside that tree, so they keep their
traceback::

    CuvilEdgeError
    ├── TargetError          unknown board, bad board data
    ├── RecipeError          bad recipe file or field
    ├── ModelError           not an ONNX file, truncated, fails the checker
    │   ├── EngineError              bundle/engine_store.py: no key for this device, wrong model, corrupt plan
    │   │   └── RecordInvalid        bundle/engine_store.py: an engine record file that is not a record
    │   └── BuildStopped             packager/engine_device.py: a device build stopped by a signal
    ├── DataError            calibration/evaluation data missing, empty or of the wrong shape
    ├── QuantizationError    quantization could not produce a model
    ├── AccuracyError        the quantized model missed the recipe's accuracy goal
    ├── BundleError          bad bundle, member, checksum or layout
    │   ├── SignatureError   bad key, bad or missing signature
    │   └── StateFileError           bundle/activation.py: a deploy state file too big, not JSON or of wrong types; also a ValueError
    ├── KernelError          bad arguments to a C kernel, library missing
    ├── TelemetryError       telemetry source or parse failure
    │   └── SourceExhausted          telemetry/base.py: the source ended normally
    ├── DaemonError          daemon configuration or serving failure
    │   ├── BadRequest               daemon/infer.py: a request the client must fix (HTTP 4xx)
    │   ├── MemoryRefused            daemon/infer.py: a model does not fit the budget (HTTP 507)
    │   ├── Refusal                  daemon/infer.py: refused before decoding: pressure, draining (HTTP 503)
    │   ├── UnknownModel             daemon/models.py: no such model or version being served
    │   │   └── ModelUnavailable     daemon/models.py: unloaded under memory pressure, back by itself (HTTP 503)
    │   ├── MemoryBudgetError        daemon/scheduler/memory.py: over the memory budget
    │   ├── SharedMemoryError        daemon/shm.py: a shared-memory request the client must fix
    │   ├── JsonRefused              daemon/limits.py: a JSON body refused (too big, deep, malformed); also a ValueError
    │   ├── RpcFailure               daemon/grpc_calls.py: an RPC answered with a gRPC error status
    │   └── CudaInitError            runtime/cuda_standin.py: the CUDA-init stand-in could not open a GPU node
    ├── DeployError          transport, device check, health gate, rollback
    │   ├── Unreachable              deploy/transport.py: network, auth or host key
    │   ├── CorruptUpload            deploy/upload.py: the upload's sha256 did not match
    │   ├── UnpackError              deploy/unpack.py: an upload that cannot be extracted or does not match its manifest
    │   ├── DeviceBusy               deploy/layout.py: another deploy holds the device lock
    │   │   └── DeviceActivating     deploy/layout.py: the device's own deploy step holds the lock
    │   ├── LockBusy                 deploy/activate.py: the device side finds the lock held
    │   ├── IncompatibleDevice       deploy/probe.py: bundle built for another board or release
    │   │   └── PackageOnlyDevice    deploy/probe.py: JetPack 4/5 (Python < 3.10): packaging only
    │   ├── SudoNeedsPassword        deploy/install.py: the login user's sudo asks for a password
    │   └── DaemonHTTPFailure        deploy/health.py: the daemon did not answer or refused
    ├── TensorRTMissing      runtime/trt/tensorrt_import.py: TensorRT or pycuda not importable here
    ├── _NoCuda              runtime/buffers.py: pycuda or a CUDA device missing (private: pageable fallback)
    ├── TopError             top.py: a daemon cannot be read (unreachable, refused, not cuvil-edged)
    └── ClientMissing        loadgen.py: tritonclient not installed (the client extra)

The leaves marked with a module live beside the code that raises them and are importable from
there; ``tests/core/test_errors.py`` walks the package and fails on an exception class outside
this tree or missing from this picture.
"""

from __future__ import annotations

__all__ = [
    "AccuracyError",
    "BundleError",
    "CuvilEdgeError",
    "DaemonError",
    "DataError",
    "DeployError",
    "InternalError",
    "KernelError",
    "ModelError",
    "QuantizationError",
    "RecipeError",
    "SignatureError",
    "TargetError",
    "TelemetryError",
]


class CuvilEdgeError(Exception):
    """Base of every error a user can cause; the message names the thing and the fix."""


class TargetError(CuvilEdgeError):
    """Unknown board name or inconsistent board data."""


class RecipeError(CuvilEdgeError):
    """A recipe file or one of its fields is invalid."""


class ModelError(CuvilEdgeError):
    """The model file is missing, not ONNX, truncated or invalid."""


class DataError(CuvilEdgeError):
    """Calibration or evaluation data is missing, empty or of the wrong shape."""


class QuantizationError(CuvilEdgeError):
    """Quantization failed to produce a usable model."""


class AccuracyError(CuvilEdgeError):
    """The quantized model missed the accuracy goal; the message says by how much."""


class BundleError(CuvilEdgeError):
    """A bundle is malformed, a member is missing or its checksum does not match."""


class SignatureError(BundleError):
    """A key is invalid, or a signature is missing, malformed or does not verify."""


class KernelError(CuvilEdgeError):
    """A C kernel was called with bad arguments, or its library could not be loaded."""


class TelemetryError(CuvilEdgeError):
    """A telemetry source failed or a line could not be parsed."""


class DaemonError(CuvilEdgeError):
    """The daemon's configuration is invalid or it could not serve."""


class DeployError(CuvilEdgeError):
    """A deployment step failed: transport, device check, health gate or rollback."""


class InternalError(Exception):
    """A bug in cuvil-edge itself; deliberately outside the CuvilEdgeError tree."""
