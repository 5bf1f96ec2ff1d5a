"""The package's public names, pinned in one table (httpx ``tests/test_exported_members.py``).

A module's ``__all__`` is a promise to its callers: a name that leaves it breaks them. Every pinned
module is listed here and nowhere else, so a change of a public name is one edit of :data:`EXPORTS`.
Beside the pins, every module of the package declares ``__all__`` and every name in it resolves.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import cuvil_edge

# Generated code carries no __all__; the packager package re-exports nothing (its modules are the API).
WITHOUT_ALL = {
    "cuvil_edge.daemon.proto.grpc_service_pb2", "cuvil_edge.daemon.proto.grpc_service_pb2_grpc",
    "cuvil_edge.daemon.proto.model_config_pb2", "cuvil_edge.packager",
}

EXPORTS: dict[str, list[str]] = {
    "cuvil_edge": [
        "AccuracyError", "BundleError", "CuvilEdgeError", "DaemonError", "DataError", "DeployError",
        "InternalError", "KernelError", "ModelError", "QuantizationError", "RecipeError", "SignatureError",
        "TargetError", "TelemetryError", "__version__"
    ],
    "cuvil_edge.bundle.engine_store": [
        "DeviceIdentity", "EngineError", "EngineRecord", "EngineStore", "MAX_RECORD_BYTES", "RECORD_FORMAT",
        "RecordInvalid", "device_identity", "host_engine_cache", "key_for_facts", "plan_matches_device",
        "sha256_bytes", "sha256_file"
    ],
    "cuvil_edge.daemon.accept": [
        "Acceptor", "BUSY_ANSWER", "FULL_ANSWER", "connection_cap", "listen_tcp", "listen_unix"
    ],
    "cuvil_edge.daemon.batcher": ["Batcher", "Pending"],
    "cuvil_edge.daemon.config": ["Config", "ENV_PREFIX", "OPTIONS", "build_parser", "load"],
    "cuvil_edge.daemon.gpu_metrics": ["GpuMetrics", "RAIL_PREFERENCE", "gpu_rail", "gpu_uuid", "power_limit_w"],
    "cuvil_edge.daemon.grpc_server": [
        "DEFAULT_GRPC_PORT", "GrpcFrontend", "RpcFailure", "decode_grpc_infer", "grpc_address"
    ],
    "cuvil_edge.daemon.http": ["HttpProtocol", "Request", "STATUS_LINES", "json_error"],
    "cuvil_edge.daemon.infer": [
        "BadRequest", "InferenceCore", "MemoryRefused", "Outcome", "Refusal", "batch_key", "check_input_header",
        "classify", "complete_inputs", "serialize_bytes"
    ],
    "cuvil_edge.daemon.kserve": ["App", "EXTENSIONS", "decode_infer", "model_config_doc", "model_metadata_doc"],
    "cuvil_edge.daemon.limits": [
        "ANSWERS_FULL", "ANSWER_WINDOW", "JsonRefused", "Limits", "MAX_ECHO", "MAX_ERROR", "answer_bytes",
        "bearer_ok", "finite_json_list", "json_depth", "loads_limited", "printable"
    ],
    "cuvil_edge.daemon.main": ["main"],
    "cuvil_edge.daemon.metrics": ["ModelStats", "render_prometheus"],
    "cuvil_edge.daemon.models": [
        "BATCH_SLOWER_CUTOFF", "ModelEntry", "ModelInstance", "ModelRegistry", "ModelUnavailable", "UnknownModel",
        "choose_batch_cap", "io_bytes_per_item",
    ],
    "cuvil_edge.daemon.pipeline": [
        "DETECTIONS", "DETECTIONS_MODEL", "IMAGE_INPUT", "NUM_DETECTIONS", "Pipeline", "TOPK_CLASSES", "TOPK_SCORES",
        "kernels",
        "top_k"
    ],
    "cuvil_edge.daemon.resources": ["Resources"],
    "cuvil_edge.daemon.scheduler": [
        "KernelMemory", "MemoryBudgetError", "MemoryScheduler", "PlacementPolicy", "PrefetchController",
        "PrefetchDecision", "PressureLevel", "PressureThresholds", "Reservation", "placement_policy"
    ],
    "cuvil_edge.daemon.server": ["STARTUP_FAILURE", "Server", "ServerState"],
    "cuvil_edge.daemon.state": ["ServerState"],
    "cuvil_edge.daemon.shm": [
        "CUDA_SHM_UNSUPPORTED", "OutputTarget", "SharedMemoryError", "SharedMemoryRegistry", "ShmRegion",
        "shm_params", "shm_route"
    ],
    "cuvil_edge.daemon.store": ["BundleStore", "read_manifest"],
    "cuvil_edge.daemon.systemd": [
        "Watchdog", "notify", "ready", "reloading", "status", "stopping", "watchdog_interval_s", "watchdog_ping"
    ],
    "cuvil_edge.deploy": [
        "DeployOptions", "DeviceAddress", "DeviceBusy", "DeviceFacts", "DeviceResult", "FleetReport",
        "IncompatibleDevice", "InstallResult", "LocalTransport", "PreparedBundle", "RolloutPolicy", "SSHTransport",
        "TRANSPORTS", "Transport", "Unreachable", "check_compatible", "deploy_device", "device_status",
        "install_daemon", "load_inventory", "open_transport", "parse_address", "prepare_bundle", "probe_device",
        "rollback_device", "rollout", "run_sync", "select_devices",
    ],
    "cuvil_edge.deploy.engines": [
        "BundleEngineSource", "EngineOutcome", "choose_plan", "ensure_engine", "ensure_engines"
    ],
    "cuvil_edge.loadgen": ["ClientMissing", "serve_and_measure", "start_daemon"],
    "cuvil_edge.packager.cli": ["engine_app", "inspect_cmd", "register"],
    "cuvil_edge.packager.dla_rules": [
        "DLA_FOLDED", "DLA_NA", "DLA_NO", "DLA_YES", "DlaContext", "dla_available", "dla_check"
    ],
    "cuvil_edge.packager.engine_build": ["EngineFromOnnx", "build_engine"],
    "cuvil_edge.packager.engine_device": ["BUILDERS", "BuildStopped", "RECORD_PREFIX", "build_into_store"],
    "cuvil_edge.packager.engine_plan": [
        "PlanRequest", "make_build_plan", "make_build_plans", "plan_member_name", "trtexec_command", "workspace_bytes"
    ],
    "cuvil_edge.packager.engine_standin": ["STANDIN_MAGIC", "main", "read_standin_plan", "standin_plan_bytes"],
    "cuvil_edge.packager.inspect": [
        "DynamicInput", "InspectReport", "NodeSupport", "dla_available", "inspect_model",
        "optimization_profiles", "parser_snapshot", "render_inspect_table", "trt_op_status"
    ],
    "cuvil_edge.packager.profiles": [
        "DynamicInput", "dynamic_inputs", "missing_profile_message", "optimization_profiles", "profile_shapes"
    ],
    "cuvil_edge.packager.trt_support": [
        "PLUGIN", "SUPPORTED", "UNSUPPORTED", "UNVERIFIED", "op_tables", "parser_restriction",
        "parser_snapshot", "trt_op_status"
    ],
    "cuvil_edge.runtime": [
        "BACKENDS", "Backend", "BackendOptions", "Footprint", "TensorSpec", "backend_class", "datatype_of",
        "dtype_of", "load_backend"
    ],
    "cuvil_edge.runtime.base": [
        "Backend", "BackendOptions", "Footprint", "TensorSpec", "datatype_of", "dtype_of"
    ],
    "cuvil_edge.runtime.buffers": ["BufferPool", "PageLockedAllocator", "Placement", "host_allocator"],
    "cuvil_edge.runtime.ort": ["OrtBackend", "rss_bytes"],
    "cuvil_edge.runtime.trt": [
        "DeviceOps", "IOSlot", "PyCudaOps", "ScratchArena", "TensorBinding", "TensorRTMissing", "TrtBackend",
        "choose_placement", "import_tensorrt", "installed_tensorrt_version", "local_l4t", "pad_batch",
        "run_slot", "select_engine", "shared_arena", "trim_shared_arena"
    ],
    "cuvil_edge.runtime.trt_select": [
        "EngineChoice", "backend_for_choice", "bundle_model_sha256", "choose_engine", "device_engine_key"
    ],
    "cuvil_edge.runtime.trt_standin": ["TrtStandinBackend"],
    "cuvil_edge.sve": [
        "Detections", "ISAS", "LIBRARY_NAME", "Letterbox", "OPS", "PLATFORMS", "cpu_info", "current_platform",
        "dequantize", "letterbox_rect", "library_for", "load_library", "nms", "normalize", "quantize",
        "resize_normalize", "select_isa", "set_num_threads", "softmax", "softmax_topk"
    ],
    "cuvil_edge.telemetry": [
        "AUTO_CHAIN", "BOARD_FIGURES", "JtopSource", "LogFileSource", "NON_DIE_SENSORS", "ReplaySource", "Sample", "Scenario",
        "SOURCE_KINDS", "SimulatedBoard", "SourceExhausted", "SourceKind", "SysfsSource", "TegrastatsSource",
        "TelemetryMonitor", "TelemetrySource", "check_spec", "expand_spec", "load_log", "open_source",
        "parse_tegrastats_line", "sample_from_jtop", "source_usage"
    ],
    "cuvil_edge.trt_plugins._python": ["register"],
}


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(cuvil_edge.__path__, "cuvil_edge."))


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_pinned_exports(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(EXPORTS[name]), (
        f"{name}.__all__ changed: update EXPORTS in tests/core/test_exported_members.py if that is meant")


def test_every_module_declares_all_and_its_names_resolve() -> None:
    problems = []
    for name in ["cuvil_edge", *_modules()]:
        module = importlib.import_module(name)
        if name in WITHOUT_ALL:
            continue
        if not hasattr(module, "__all__"):
            problems.append(f"{name} declares no __all__")
            continue
        problems.extend(f"{name}.{member} is in __all__ but not defined" for member in module.__all__
                        if not hasattr(module, member))
    assert not problems, "\n".join(problems)


def test_the_table_names_real_modules() -> None:
    known = {"cuvil_edge", *_modules()}
    assert set(EXPORTS) <= known, sorted(set(EXPORTS) - known)
    assert WITHOUT_ALL <= known, sorted(WITHOUT_ALL - known)
