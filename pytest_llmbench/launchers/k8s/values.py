"""The rules for every value that reaches a Kubernetes manifest, checked where it enters.

Standard library only (profiles and settings use it without the Kubernetes extras). Each
check returns None or the rule the value breaks; callers name the value and its source
(flag, env var, ini key, profile file and key). The templates also pass every value
through ``tojson``, so even an unchecked value stays one YAML scalar.

Rules as the API server applies them (k8s.io/apimachinery/pkg/util/validation, resource
quantities from k8s.io/apimachinery/pkg/api/resource), images as the OCI distribution
reference grammar.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from pytest_llmbench.launchers.k8s.rdma import network_problem

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(_LABEL, re.ASCII)  # re.ASCII throughout: \d and \w must not match '１' or 'é'
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*", re.ASCII)
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME = re.compile(rf"((?P<prefix>{_LABEL}(\.{_LABEL})*)/)?(?P<name>{_NAME})", re.ASCII)
LABEL_VALUE = re.compile(rf"({_NAME})?", re.ASCII)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?",
                      re.ASCII)
# OCI reference: [registry[:port]/]path[:tag][@digest] (distribution/reference)
_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_DOMAIN = r"([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?))*(:\d+)?"
IMAGE = re.compile(rf"({_DOMAIN}/)?{_COMPONENT}(/{_COMPONENT})*(:[\w][\w.-]{{0,127}})?"
                   rf"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?", re.ASCII)
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _pattern(regex: re.Pattern, max_len: int, rule: str) -> Callable[[Any], str | None]:
    """A check: a string of at most ``max_len`` characters that ``regex`` matches whole."""
    def check(value: Any) -> str | None:
        ok = isinstance(value, str) and len(value) <= max_len and regex.fullmatch(value)
        return None if ok else rule
    return check


dns_label = _pattern(DNS_LABEL, 63, "must be a DNS-1123 label: lower-case letters, digits and '-', "
                     "starting and ending with a letter or digit, at most 63 characters")
dns_subdomain = _pattern(DNS_SUBDOMAIN, 253, "must be a DNS-1123 subdomain: dot-separated DNS-1123 "
                         "labels (lower-case letters, digits, '-'), at most 253 characters")
label_value = _pattern(LABEL_VALUE, 63, "must be a label value: at most 63 letters, digits, '-', '_' "
                       "or '.', starting and ending with a letter or digit (or empty)")
env_name = _pattern(ENV_NAME, 4096, "must be an environment variable name: a C identifier (letters, "
                    "digits, '_'; no leading digit)")
image = _pattern(IMAGE, 4096, "must be an OCI image reference: [registry[:port]/]repository[:tag]"
                 "[@sha256:digest], repository in lower case")


def qualified_name(value: Any) -> str | None:
    """A label key, a resource name or a taint key: [DNS-subdomain prefix/]name."""
    match = QUALIFIED_NAME.fullmatch(value) if isinstance(value, str) else None
    if match and len(match["name"]) <= 63 and len(match["prefix"] or "") <= 253:
        return None
    return ("must be a qualified name: an optional DNS-1123 subdomain prefix and '/', then at most "
            "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")


def quantity(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    if isinstance(value, str) and QUANTITY.fullmatch(value):
        return None
    return "must be a Kubernetes resource quantity, e.g. 8, 500m, 48Gi, 1.5G"


def toleration(value: Any) -> str | None:
    if not isinstance(value, dict) or set(value) - TOLERATION_KEYS:
        return f"must be a table with only the keys {', '.join(sorted(TOLERATION_KEYS))}"
    if "key" in value and qualified_name(value["key"]):
        return f"key {value['key']!r} {qualified_name(value['key'])}"
    if value.get("operator", "Equal") not in ("Equal", "Exists"):
        return "operator must be Equal or Exists"
    if "value" in value and label_value(value["value"]):
        return f"value {value['value']!r} {label_value(value['value'])}"
    if "effect" in value and value["effect"] not in EFFECTS:
        return f"effect must be one of {', '.join(EFFECTS)}"
    seconds = value.get("tolerationSeconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        return "tolerationSeconds must be an integer"
    return None


def toml_key(name: str) -> str:
    """A table key as TOML writes it: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def _seconds(value: Any) -> str | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and value > 0
    return None if ok else "must be a finite positive number of seconds"


def _whole_seconds(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a positive whole number of seconds (the API field is an integer)"


def queue_name(value: Any) -> str | None:
    """A Kueue LocalQueue's name: an object name (DNS-1123 subdomain) that is also a label value."""
    return dns_subdomain(value) or (None if len(value) <= 63 else "must be at most 63 characters "
                                    "(it is the value of the kueue.x-k8s.io/queue-name label)")


# Label keys the launcher sets itself (labels of its own, and the queue's through ``queue``)
OWN_LABEL_PREFIXES = ("llmbench.dev/", "app.kubernetes.io/part-of", "app.kubernetes.io/component",
                      "kueue.x-k8s.io/queue-name")
ANNOTATIONS_MAX_BYTES = 256 * 1024  # the API server's TotalAnnotationSizeLimitB


def _labels(value: Any) -> tuple[str, Any, str] | None:
    if not isinstance(value, dict):
        return "", value, "must be a table of label keys to values"
    for name, item in value.items():
        rule = qualified_name(name)
        if not rule and name.startswith(OWN_LABEL_PREFIXES):
            rule = "is set by the launcher itself (the queue by the k8s.queue key)"
        if rule or label_value(item):
            return f".{toml_key(name)}", name if rule else item, rule or label_value(item)
    return None


def _annotations(value: Any) -> tuple[str, Any, str] | None:
    if not isinstance(value, dict):
        return "", value, "must be a table of annotation keys to string values"
    for name, item in value.items():
        rule = qualified_name(name) or _text(item)
        if rule:
            return f".{toml_key(name)}", name if qualified_name(name) else item, rule
    size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
    if size > ANNOTATIONS_MAX_BYTES:
        limit = f"must total at most {ANNOTATIONS_MAX_BYTES} bytes (the API server's limit)"
        return "", f"{size} bytes", limit
    return None


PLACEMENT_KEYS = {  # the profile's [k8s] table: key -> rule for its value
    "gpu_resource": qualified_name, "cpu": quantity, "memory": quantity, "shm_size": quantity,
    "host_network": _boolean, "host_network_reason": _text, "schedule_timeout_s": _seconds,
    "rendezvous_timeout_s": _seconds, "ttl_s": _whole_seconds, "rdma": network_problem,
    "queue": queue_name, "priority_class": dns_subdomain, "queue_timeout_s": _seconds,
    "node_selector": None, "tolerations": None, "extra_resources": None,  # checked item by item
    "labels": None, "annotations": None, "image_compiler": _boolean,
}


def placement_problem(table: dict[str, Any]) -> tuple[str, Any, str] | None:
    """(key under k8s., the value, the rule it breaks) for the first bad entry, or None."""
    for key, value in table.items():
        if key not in PLACEMENT_KEYS:
            return key, value, f"unknown key; known: {', '.join(sorted(PLACEMENT_KEYS))}"
        if key in ("node_selector", "extra_resources"):
            if not isinstance(value, dict):
                return key, value, "must be a table"
            check_value = label_value if key == "node_selector" else quantity
            for name, item in value.items():
                rule = qualified_name(name)
                if rule:
                    return f"{key}.{toml_key(name)}", name, rule
                rule = check_value(item)
                if rule:
                    return f"{key}.{toml_key(name)}", item, rule
        elif key in ("labels", "annotations"):
            found = (_labels if key == "labels" else _annotations)(value)
            if found:
                where, item, rule = found
                return key + where, item, rule
        elif key == "tolerations":
            if not isinstance(value, list):
                return key, value, "must be a list of tables"
            for i, item in enumerate(value):
                rule = toleration(item)
                if rule:
                    return f"{key}[{i}]", item, rule
        else:
            rule = PLACEMENT_KEYS[key](value)
            if rule:
                return key, value, rule
    return None
