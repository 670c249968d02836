"""moebatch.v1: the gRPC API (package moebatch.v1 of proto/moebatch/v1/batch.proto).

batch_pb2 (messages) and batch_pb2_grpc (BatchServiceStub, BatchServiceServicer) are generated
from the proto by grpcio-tools when the package is built (setup.py); they are not committed.
"""
