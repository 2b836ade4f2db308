"""browser.py: headless Chromium driven over the DevTools protocol (CDP), for the checks that open a page the way a
person would (check_memory_page.py, check_trace_viewers.py).

Uses Debian's /usr/bin/chromium and the `websocket-client` package: no chromedriver, no browser download. A check
calls require_chromium() first, which exits 77 with "skipped: <reason>" (run_checks.sh counts it as skipped) when
either is missing; then Browser(chromium) starts a browser with one page. LocalServer serves files to it on the
loopback address, for pages that fetch their parts (file:// would refuse them).
"""
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SKIPPED = 77
DEFAULT_CHROMIUM = "/usr/bin/chromium"


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(SKIPPED)


def require_chromium(path=None):
    """The Chromium to run (path, $CHROMIUM, /usr/bin/chromium or the one on PATH); skips the check when there is
    none or websocket-client is not installed."""
    path = path or os.environ.get("CHROMIUM", DEFAULT_CHROMIUM)
    chromium = path if os.path.exists(path) else shutil.which("chromium")
    if chromium is None:
        skip(f"no Chromium at {path} (Debian package 'chromium')")
    try:
        import websocket  # noqa: F401
    except ImportError:
        skip("Python package websocket-client is not installed (pip install websocket-client)")
    return chromium


class Browser:
    """A headless Chromium and one page of it, spoken to over CDP."""

    def __init__(self, chromium, viewport=(1600, 1000)):
        import websocket  # websocket-client; require_chromium checked it

        self.viewport = viewport
        self.profile = tempfile.mkdtemp(prefix="fsdplab-chromium-")
        arguments = [chromium, "--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--no-default-browser-check", "--remote-debugging-port=0", "--remote-allow-origins=*",
                     f"--user-data-dir={self.profile}", f"--window-size={viewport[0]},{viewport[1]}",
                     "--allow-file-access-from-files", "about:blank"]
        if os.geteuid() == 0:
            arguments.insert(1, "--no-sandbox")  # Chromium refuses to run as root inside its sandbox
        self.process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self.devtools_port()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                pages = [target for target in json.load(answer) if target["type"] == "page"]
            self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                                      suppress_origin=True)
        except BaseException:
            self.socket = None
            self.close()
            raise
        self.next_id = 0
        self.events = []

    def devtools_port(self):
        """Chromium writes the port it chose into <profile>/DevToolsActivePort once it listens."""
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self.process.returncode} before listening")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as file:
                    first = file.readline().strip()
                if first.isdigit():
                    return int(first)
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port within 30 s")

    def send(self, method, **params):
        self.next_id += 1
        message_id = self.next_id
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def enable(self):
        """Turns on the events errors() reads and sets the viewport; call once before the first navigate."""
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.send(domain)
        self.send("Emulation.setDeviceMetricsOverride", width=self.viewport[0], height=self.viewport[1],
                  deviceScaleFactor=1, mobile=False)

    def navigate(self, url):
        self.send("Page.navigate", url=url)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (a promise is awaited); it must be JSON-serializable."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            cause = details.get("exception", {}).get("description") or details.get("text")
            raise RuntimeError(f"page script failed: {cause} in {expression[:80]}")
        return result["result"].get("value")

    def wait_for(self, expression, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.evaluate(expression):
                return True
            time.sleep(0.05)
        return False

    def errors(self):
        """Console errors, uncaught exceptions and browser log errors seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console.error: " + " ".join(str(arg.get("value", arg.get("description")))
                                                          for arg in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
        return found

    def forget_events(self):
        """Drops the events seen so far, so errors() then reports only what comes after."""
        self.events = []

    def close(self):
        try:
            if self.socket is not None:
                self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


class LocalServer:
    """Serves {url path: (content type, file path or bytes)} on 127.0.0.1 at a port the system picks, from a
    thread, until close()."""

    def __init__(self, routes):
        def body_of(source):
            if isinstance(source, bytes):
                return source
            with open(source, "rb") as file:
                return file.read()

        bodies = {path: (kind, body_of(source)) for path, (kind, source) in routes.items()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                route = bodies.get(self.path.split("?")[0])
                if route is None:
                    self.send_error(404)
                    return
                kind, body = route
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass  # the check's output is its report, not an access log

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
