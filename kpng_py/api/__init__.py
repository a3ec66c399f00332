"""The localv1 wire API (generated code) and its gRPC method names."""

try:
    from kpng_py.api import localv1_pb2 as localv1
except ImportError as err:  # pragma: no cover - only on a tree that skipped setup
    raise ImportError(
        "kpng_py.api.localv1_pb2 is missing: generate it with `make setup` "
        "(hack/setup.sh runs grpc_tools.protoc on proto/localv1.proto)"
    ) from err

# The method served and dialled. Older KPNG releases used the legacy name with
# the same messages and field numbers; the server answers both.
WATCH_METHOD = "/localv1.Sets/Watch"
LEGACY_WATCH_METHOD = "/localnetv1.Endpoints/Watch"

__all__ = ["localv1", "WATCH_METHOD", "LEGACY_WATCH_METHOD"]
