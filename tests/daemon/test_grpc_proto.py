"""Our checked-in gRPC messages are wire-compatible with Triton's (tritonclient.grpc's descriptors).

For every message and field we define: same full name, same field number, same wire type, same
label (repeated or not), same message/enum type name, same oneof membership; the service's
methods carry the same request/response types and streaming flags. Enums keep Triton's values.
A round trip through both encoders proves the bytes agree on real messages too.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc.model_config_pb2 as triton_config
import tritonclient.grpc.service_pb2 as triton_service
from google.protobuf.descriptor import Descriptor, EnumDescriptor

from cuvil_edge.daemon.proto import grpc_service_pb2 as ours_service
from cuvil_edge.daemon.proto import model_config_pb2 as ours_config


def _messages(desc: Descriptor):
    yield desc
    for nested in desc.nested_types:
        yield from _messages(nested)


def _all_ours():
    for mod in (ours_service, ours_config):
        for desc in mod.DESCRIPTOR.message_types_by_name.values():
            yield from _messages(desc)


def _triton_message(full_name: str) -> Descriptor:
    for mod in (triton_service, triton_config):
        try:
            return mod.DESCRIPTOR.pool.FindMessageTypeByName(full_name)
        except KeyError:
            continue
    raise AssertionError(f"{full_name} is not one of Triton's messages")


OURS = sorted(_all_ours(), key=lambda d: d.full_name)


def test_the_subset_is_not_empty():
    names = {d.full_name for d in OURS}
    assert {"inference.ModelInferRequest", "inference.ModelInferResponse", "inference.ModelConfig",
            "inference.SystemSharedMemoryRegisterRequest"} <= names
    assert len(names) > 60


@pytest.mark.parametrize("ours", OURS, ids=lambda d: d.full_name)
def test_message_fields_match_triton(ours: Descriptor):
    theirs = _triton_message(ours.full_name)
    assert ours.GetOptions().map_entry == theirs.GetOptions().map_entry
    for field in ours.fields:
        other = theirs.fields_by_name.get(field.name)
        assert other is not None, f"{ours.full_name}.{field.name} is not in Triton's message"
        where = f"{ours.full_name}.{field.name}"
        assert field.number == other.number, where
        assert field.type == other.type, where
        assert field.is_repeated == other.is_repeated, where
        if field.message_type is not None:
            assert field.message_type.full_name == other.message_type.full_name, where
        if field.enum_type is not None:
            assert field.enum_type.full_name == other.enum_type.full_name, where
        ours_oneof = field.containing_oneof.name if field.containing_oneof else None
        their_oneof = other.containing_oneof.name if other.containing_oneof else None
        assert ours_oneof == their_oneof, where


def _enums():
    for mod in (ours_service, ours_config):
        yield from mod.DESCRIPTOR.enum_types_by_name.values()
    for d in OURS:
        yield from d.enum_types


@pytest.mark.parametrize("ours", sorted(_enums(), key=lambda e: e.full_name), ids=lambda e: e.full_name)
def test_enum_values_match_triton(ours: EnumDescriptor):
    theirs = triton_config.DESCRIPTOR.pool.FindEnumTypeByName(ours.full_name)
    assert {v.name: v.number for v in ours.values}.items() <= {v.name: v.number for v in theirs.values}.items()


def test_service_methods_match_triton():
    ours = ours_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    required = {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig",
                "ModelInfer", "ModelStreamInfer", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
                "RepositoryModelUnload", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
                "SystemSharedMemoryUnregister"}
    assert required <= set(ours.methods_by_name)
    for m in ours.methods:
        t = theirs.methods_by_name[m.name]
        assert m.input_type.full_name == t.input_type.full_name, m.name
        assert m.output_type.full_name == t.output_type.full_name, m.name
        assert (m.client_streaming, m.server_streaming) == (t.client_streaming, t.server_streaming), m.name


def test_bytes_round_trip_both_ways():
    """A request built by tritonclient's classes parses in ours and back, byte for byte."""
    x = np.arange(64, dtype=np.float32)
    req = triton_service.ModelInferRequest(model_name="digits", model_version="1.0.0", id="r1")
    t = req.inputs.add(name="input", datatype="FP32", shape=[1, 1, 8, 8])
    t.parameters["shared_memory_offset"].int64_param = 16
    req.outputs.add(name="logits").parameters["classification"].int64_param = 3
    req.parameters["binary_data_output"].bool_param = True
    req.raw_input_contents.append(x.tobytes())
    wire = req.SerializeToString(deterministic=True)
    mine = ours_service.ModelInferRequest.FromString(wire)
    assert mine.inputs[0].parameters["shared_memory_offset"].int64_param == 16
    assert mine.outputs[0].parameters["classification"].int64_param == 3
    assert np.array_equal(np.frombuffer(mine.raw_input_contents[0], np.float32), x)
    assert mine.SerializeToString(deterministic=True) == wire

    cfg = ours_config.ModelConfig(name="digits", platform="onnxruntime_onnx", max_batch_size=8)
    cfg.input.add(name="input", data_type=ours_config.TYPE_FP32, dims=[1, 8, 8])
    cfg.dynamic_batching.preferred_batch_size.extend([4, 8])
    back = triton_config.ModelConfig.FromString(cfg.SerializeToString())
    assert back.input[0].data_type == triton_config.TYPE_FP32 and list(back.input[0].dims) == [1, 8, 8]
    assert list(back.dynamic_batching.preferred_batch_size) == [4, 8]
