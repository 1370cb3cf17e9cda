"""tokensel.v1 messages (tokensel_pb2) and the TokenSelect stub
(tokensel_pb2_grpc), made at import from tokensel.proto's descriptor, which
the package build serializes into tokensel_descriptor.bin."""
