"""Server reflection in both versions: ``grpc.reflection.v1``, which current tools (grpcurl,
Postman, grpcui) ask for first, and ``grpc.reflection.v1alpha``.

grpcio-reflection implements v1alpha only. v1 is the same protocol under a new package name
(the same messages with the same field numbers), so its descriptor is v1alpha's with the
package renamed, and one servicer answers on both service names.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as alpha_grpc

V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_v1_descriptor() -> None:
    """Add the v1 file to the default pool, so that reflection can describe itself in v1."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return  # a newer grpcio-reflection (or another library) registered it already
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    alpha = f".{reflection_pb2.DESCRIPTOR.package}."
    proto.name = _V1_FILE
    proto.package = V1_PACKAGE
    proto.ClearField("options")  # language packages name v1alpha
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):  # assigning "" would set it on a scalar
                field.type_name = field.type_name.replace(alpha, f".{V1_PACKAGE}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(alpha, f".{V1_PACKAGE}.")
            method.output_type = method.output_type.replace(alpha, f".{V1_PACKAGE}.")
    pool.AddSerializedFile(proto.SerializeToString())


def enable_reflection(service_names: tuple[str, ...], server: grpc.aio.Server) -> None:
    """Serve reflection on ``server`` in v1 and v1alpha, listing ``service_names`` and both
    reflection services."""
    _register_v1_descriptor()
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # The messages are the same on the wire: v1 reuses v1alpha's (de)serializers.
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": handler}),)
    )
