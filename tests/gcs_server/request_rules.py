"""What the test proxy (tests/gcs_server/proxy.py) does to chosen requests instead of forwarding them as they come,
steered by files in its DIRECTORY so that a test (another process) can change them while it runs:

- faults.jsonl: answer N requests matching a regex with an error status, instead of forwarding them or after
  (`Faults`; served ones are logged to faults_served.log);
- holds.jsonl: hold the first request matching a regex until the test releases it (`Holds`): a client frozen in the
  middle of a request, deterministically. The proxy writes held/<id> (the request's description) when it holds it,
  waits for released/<id>, then handles the request as usual, against the storage's state at the release, and
  writes answered/<id> (the answer's HTTP status) once the answer is sent;
- ignore_preconditions (a regex, while the file exists): a storage that does not enforce ifGenerationMatch and
  ifMetagenerationMatch in the requests matching it (they are removed before forwarding), for negative controls.

A request's description is 'METHOD /decoded/path?query NAMES...', the names being the objects it reads or creates
(tests/gcs_server/object_names.py).
"""

import json
import os
import re
import threading
import time
import urllib.parse

PRECONDITIONS = ("ifGenerationMatch", "ifMetagenerationMatch")


def _rules(path: str) -> list[dict]:
    try:
        with open(path) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def _matches(rule: dict, method: str, described: str) -> bool:
    return rule.get("method") in (None, method) and re.search(rule["pattern"], described) is not None


class Faults:
    """The failures to inject (one JSON rule a line: id, pattern, status, count, method, forwarded) and how many of
    each were served (kept here, and logged for the tests)."""

    def __init__(self, directory: str):
        self.rules_file = os.path.join(directory, "faults.jsonl")
        self.served_file = os.path.join(directory, "faults_served.log")
        self._served: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, method: str, described: str) -> dict | None:
        """The rule that fails this request (and counts it), or None."""
        rules = _rules(self.rules_file)
        with self._lock:
            for rule in rules:
                if not _matches(rule, method, described):
                    continue
                if self._served.get(rule["id"], 0) < rule["count"]:
                    self._served[rule["id"]] = self._served.get(rule["id"], 0) + 1
                    with open(self.served_file, "a") as handle:
                        handle.write(f"{rule['id']} {described}\n")
                    return rule
        return None


class Holds:
    """Requests held until released (one JSON rule a line: id, pattern, method, skip; each holds one request, the
    first matching one after `skip` matching ones went through)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.rules_file = os.path.join(directory, "holds.jsonl")
        for folder in ("held", "released", "answered"):
            os.makedirs(os.path.join(directory, folder), exist_ok=True)
        self._matched: dict[str, int] = {}  # Rule id -> requests it matched so far.
        self._lock = threading.Lock()

    def hold(self, method: str, described: str) -> str | None:
        """Blocks while a rule holds this request; returns the rule's id (None when no rule took it)."""
        with self._lock:
            rule = None
            for candidate in _rules(self.rules_file):
                if self._matched.get(candidate["id"], 0) <= candidate["skip"] and \
                        _matches(candidate, method, described):
                    self._matched[candidate["id"]] = self._matched.get(candidate["id"], 0) + 1
                    if self._matched[candidate["id"]] > candidate["skip"]:
                        rule = candidate
                        break
            if rule is None:
                return None
        self._mark("held", rule["id"], described)
        while not os.path.exists(os.path.join(self.directory, "released", rule["id"])):
            time.sleep(0.02)
        return rule["id"]

    def answered(self, rule: str, status: int) -> None:
        self._mark("answered", rule, str(status))

    def _mark(self, folder: str, rule: str, text: str) -> None:
        path = os.path.join(self.directory, folder, rule)
        with open(path + ".tmp", "w") as handle:
            handle.write(text)
        os.rename(path + ".tmp", path)  # Readers see the whole text or nothing.

    def preconditions_ignored(self, described: str) -> bool:
        try:
            with open(os.path.join(self.directory, "ignore_preconditions")) as handle:
                return re.search(handle.read(), described) is not None
        except FileNotFoundError:
            return False


def without_preconditions(path: str) -> str:
    """`path` (path and query) without ifGenerationMatch and ifMetagenerationMatch."""
    parts = urllib.parse.urlsplit(path)
    query = [(key, value) for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
             if key not in PRECONDITIONS]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
