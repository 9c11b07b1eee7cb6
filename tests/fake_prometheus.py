"""A tiny HTTP Prometheus for the dashboard's unit tests: it knows a set of series (name and
labels), answers query_range with a canned rising series when every vector selector of some
`or` branch of the query matches one of them (=, !=, =~, !~ as Prometheus matches: anchored),
and label values from the series a selector matches. It logs the queries it was asked."""
from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def matches(series: tuple[str, dict], name: str, matchers: str) -> bool:
    if series[0] != name:
        return False
    for label, op, value in MATCHER.findall(matchers):
        have = series[1].get(label, "")
        hit = re.fullmatch(value, have) is not None if op in ("=~", "!~") else have == value
        if hit != (op in ("=", "=~")):
            return False
    return True


class FakePrometheus:
    def __init__(self, series: list[tuple[str, dict]], points: int = 20):
        self.series, self.points, self.asked = series, points, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(url.query))
                if url.path == "/api/v1/query_range":
                    data = {"resultType": "matrix", "result": fake.answer(q)}
                elif url.path.startswith("/api/v1/label/"):
                    label = url.path.split("/")[4]
                    data = sorted({s[1].get(label) for s in fake.selected(q["match[]"]) if label in s[1]})
                else:
                    self.send_error(404)
                    return
                body = json.dumps({"status": "success", "data": data}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def selected(self, expr: str) -> list[tuple[str, dict]]:
        sels = SELECTOR.findall(expr) or [(expr.strip(), "")]  # a bare metric name
        return [s for name, m in sels for s in self.series if matches(s, name, m)]

    def answer(self, q: dict) -> list[dict]:
        self.asked.append(q)
        expr = q["query"]
        branches = expr.split(" or ")
        if not any(all(any(matches(s, n, m) for s in self.series) for n, m in SELECTOR.findall(b)) for b in branches):
            return []
        start, end = float(q["start"]), float(q["end"])
        step = (end - start) / (self.points - 1)
        labels = {k: v for _, m in SELECTOR.findall(expr)[:1] for k, _, v in MATCHER.findall(m)
                  if k in ("role", "group") and re.fullmatch(r"\w+", v)}
        return [{"metric": labels, "values": [[start + i * step, str(float(i + 1))] for i in range(self.points)]}]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
