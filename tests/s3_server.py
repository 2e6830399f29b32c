"""A real S3-compatible server for the tests and benchmarks: moto's server mode (``moto_server``, the
``moto[server]`` package), a process of its own on a free loopback port, stopped at the end.  Not the in-process
``mock_aws``: scalemb talks HTTP to it through s3fs/botocore as it would to any S3 endpoint.
``S3Server.available()`` is False where moto's server is not installed (the tests skip, naming it)."""
import os
import socket
import subprocess
import sys
import time
import urllib.request


class S3Server:
    """``moto_server`` on ``127.0.0.1:port``; ``env()`` holds the AWS variables that reach it."""

    MISSING = "moto's S3 server is not installed: pip install 'moto[server]'"

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start on port {self.port}") from None
                time.sleep(0.1)

    @staticmethod
    def available() -> bool:
        try:
            import flask  # noqa: F401 - moto's server mode needs it
            import moto.server  # noqa: F401
        except ImportError:
            return False
        return True

    def env(self) -> dict:
        """Credentials (any, for moto) and the endpoint, as the standard AWS variables."""
        return {"AWS_ACCESS_KEY_ID": "scalemb-test", "AWS_SECRET_ACCESS_KEY": "scalemb-test-secret",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(key="scalemb-test", secret="scalemb-test-secret", skip_instance_cache=True,
                                 use_listings_cache=False, client_kwargs={"endpoint_url": self.endpoint})

    def make_bucket(self, name: str) -> str:
        self.filesystem().mkdir(name)
        return f"s3://{name}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main():  # pragma: no cover - for benchmarks: print the endpoint and keep serving
    server = S3Server()
    print(server.endpoint, flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
