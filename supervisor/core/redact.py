"""Notification URLs carry secrets (passwords, bot tokens, webhook keys): every URL that reaches a
log, an error or `config show` goes through ``redact_url``, and free text through ``redact_text``."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

# Services whose URL is the secret itself (bot tokens, webhook ids and keys).
_TOKEN_SCHEMES = frozenset({
    "tgram", "discord", "slack", "pbul", "pover", "msteams", "ifttt", "join", "ntfy", "ntfys",
    "pushed", "pjet", "pjets", "spush", "ryver", "zulip", "twist", "flock", "gchat", "guilded",
    "lametric", "lametrics", "line", "mastodon", "toot", "toots", "opsgenie", "pagerduty",
    "pushbullet", "pushover", "signal", "signals", "teams", "webex", "wxteams",
})
# Hosts of well-known webhooks: how many leading path segments are not secret.
_WEBHOOK_HOSTS = {
    "hooks.slack.com": 1,  # /services/T…/B…/token
    "discord.com": 2,  # /api/webhooks/id/token
    "discordapp.com": 2,
    "api.telegram.org": 0,  # /bot<token>/sendMessage
    "outlook.office.com": 1,  # /webhook/…
    "hooks.zapier.com": 2,  # /hooks/catch/…
    "maker.ifttt.com": 0,
    "chat.googleapis.com": 4,  # /v1/spaces/X/messages?key=…&token=…
}
_SECRET_NAME = re.compile(r"token|key|secret|pass|pwd|auth|sig|code|session|credential|webhook", re.I)
# A path segment that looks generated (long, mixes letters and digits) is treated as a key.
_TOKENISH = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9_\-.~%:]{16,}$")
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]{1,15}://[^\s'\"<>]+")


# An alert route's tags before its URL (`failure,gpu_fault=ntfy://…`): kept, the URL after redacted.
_ROUTE_TAGS = re.compile(r"^\s*[\w\s,-]+=(?=\s*[a-zA-Z][a-zA-Z0-9+.\-]*://)")


def redact_url(url: str) -> str:
    """The URL with passwords, tokens and webhook keys replaced by ``***`` (safe to log); an alert
    route's tags (`TAGS=URL`) are kept and its URL redacted."""
    route = _ROUTE_TAGS.match(url)
    if route:
        return route.group(0) + redact_url(url[route.end():].strip())
    try:
        return _redact(url)
    except Exception:  # noqa: BLE001 - unparseable: show only the scheme
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://{MASK}" if sep else MASK


def redact_text(text: str) -> str:
    """Every URL inside free text, redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _TOKEN_SCHEMES:
        return f"{parts.scheme}://{MASK}"
    netloc = _redact_netloc(parts.netloc)
    host = parts.netloc.rpartition("@")[2].split(":")[0].lower()
    path = _redact_path(parts.path, _kept_segments(host))
    query = _redact_query(parts.query)
    fragment = MASK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def _redact_netloc(netloc: str) -> str:
    userinfo, at, hostport = netloc.rpartition("@")
    if not at:
        return netloc
    user, colon, _password = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}@{hostport}"
    return f"{userinfo}@{hostport}"


def _kept_segments(host: str) -> int | None:
    if host in _WEBHOOK_HOSTS:
        return _WEBHOOK_HOSTS[host]
    if host.endswith(".webhook.office.com"):
        return 1
    return None


def _redact_path(path: str, keep: int | None) -> str:
    segments = path.split("/")
    out: list[str] = []
    index = 0
    for segment in segments:
        if not segment:
            out.append(segment)
            continue
        secret = (index >= keep) if keep is not None else bool(_TOKENISH.match(segment))
        out.append(MASK if secret else segment)
        index += 1
    return "/".join(out)


def _redact_query(query: str) -> str:
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    cleaned = [(k, MASK if _SECRET_NAME.search(k) or _TOKENISH.match(v) else v) for k, v in pairs]
    return urlencode(cleaned, safe="*@:/,")
