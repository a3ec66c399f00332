"""The backend's end of a localv1 Watch stream: the client that keeps one
stream to a brain up and hands its ops to the state (`client`), over grpclib
(`grpclib_watch`)."""
