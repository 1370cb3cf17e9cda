"""Generated tokensel.v1 stubs (tokensel_pb2, tokensel_pb2_grpc), built from
proto/tokensel/v1/tokensel.proto when the package is built."""
