"""Notification URLs carry secrets (passwords, bot tokens, webhook keys, API keys): every URL that
reaches a log, an error or `config show` goes through ``redact_url``, and free text through
``redact_text``.

What is shown of a URL is its scheme, an alert route's tags, and its host, and nothing else.
Apprise has over a hundred services, and each puts its secret somewhere else: the user part
(`mailto://me:PASS@host`), the path (`gotify://host/TOKEN`, `json://host/path/hook`), the query,
or the "host" itself (`prowl://APIKEY`, `tgram://BOT:TOKEN/chat`, `pover://USER@TOKEN`).  No
list of where each one hides it stays right, so none is kept: the rest of the URL is masked
whatever it holds, and a host is shown only where it looks like one (an IP address,
`localhost`, or a dotted name ending in a letters-only top-level domain) and the scheme is not
one whose host part is a key.
"""

from __future__ import annotations

import ipaddress
import re

MASK = "***"

# Services whose "host" part is a token, a key, a user or a topic, never a server.
_TOKEN_SCHEMES = frozenset({
    "tgram", "discord", "slack", "pbul", "pover", "msteams", "ifttt", "join", "ntfy", "ntfys",
    "pushed", "pjet", "pjets", "spush", "ryver", "zulip", "twist", "flock", "gchat", "guilded",
    "lametric", "lametrics", "line", "mastodon", "toot", "toots", "opsgenie", "pagerduty",
    "pushbullet", "pushover", "signal", "signals", "teams", "webex", "wxteams", "prowl",
    "simplepush", "spushs", "notica", "bark", "barks", "clicksend", "d7sms", "dapnet", "fcm",
    "kavenegar", "mailgun", "sendgrid", "sparkpost", "messagebird", "msg91", "nexmo", "vonage",
    "sinch", "twilio", "bulksms", "burstsms", "threema", "pushsafer", "psafer",
    "psafers", "reddit", "strmlabs", "streamlabs", "techulus", "wxpusher",
    "feishu", "lark", "dingtalk", "wecombot", "serverchan", "schan", "pushplus", "pagertree",
    "pushme", "splunk", "victorops", "revolt", "notifiarr", "misskey", "bluesky", "bsky",
    "whatsapp", "seven", "smsmgr", "voipms", "signl4", "resend", "brevo", "pushjet", "ses", "sns",
})
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_TLD = re.compile(r"[a-z]{2,63}")
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]{1,15}://[^\s'\"<>]+")
_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]{0,31}")


# An alert route's tags before its URL (`failure,gpu_fault=ntfy://…`): kept, the URL after redacted.
_ROUTE_TAGS = re.compile(r"^\s*[\w\s,-]+=(?=\s*[a-zA-Z][a-zA-Z0-9+.\-]*://)")


def redact_url(url: str) -> str:
    """The URL as it may be shown: its scheme and host, the rest ``***`` (module docstring); an
    alert route's tags (`TAGS=URL`) are kept."""
    route = _ROUTE_TAGS.match(url)
    if route:
        return route.group(0) + redact_url(url[route.end():].strip())
    scheme, sep, rest = url.strip().partition("://")
    if not sep or _SCHEME.fullmatch(scheme) is None:
        return MASK
    # The authority ends at the first "/", "?" or "#"; the host is what follows its last "@".
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    host = _shown_host(scheme.lower(), authority.rpartition("@")[2])
    masked = host is None or authority != host or len(rest) > len(authority)
    return f"{scheme}://{host or MASK}" + (f"/{MASK}" if masked and host is not None else "")


def redact_text(text: str) -> str:
    """Every URL inside free text, redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def _shown_host(scheme: str, hostport: str) -> str | None:
    """The host of ``hostport`` if it may be shown (a server's name or address), else None."""
    if scheme in _TOKEN_SCHEMES:
        return None
    if hostport.startswith("["):  # an IPv6 literal, [::1]:port
        literal = hostport[1:].partition("]")[0]
        return f"[{literal}]" if _is_ip(literal) else None
    host = hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport
    lowered = host.lower()
    if lowered == "localhost" or _is_ip(lowered):
        return host
    labels = lowered.split(".")
    if len(labels) >= 2 and all(_LABEL.fullmatch(label) for label in labels) and _TLD.fullmatch(labels[-1]):
        return host
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# A command line's secrets: the value of a flag or a variable whose name says it is one
# (`--hf-token=hf_…`, `--api-key KEY`, `WANDB_API_KEY=…`).
# The name's last word decides (`--keyframes`, `--monkey` are no secrets).
_SECRET_FLAG = re.compile(r"(?i)(?<![\w-])(-{0,2}(?:[a-z0-9]+[-_.])*(?:token|key|apikey|secret|password|passwd|pwd|auth"
                          r"|credentials?)s?)(=|\s+)(?!-)(\S+)")
COMMAND_CHARS = 300  # what is kept of a command line: a launcher's argv can be pages long


def redact_command(command: str, limit: int = COMMAND_CHARS) -> str:
    """A process's command line as it may be stored and shown: secret-looking flags' values
    masked, URLs redacted, and cut to ``limit`` characters."""
    masked = _SECRET_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", redact_text(command))
    return masked if len(masked) <= limit else masked[:limit] + "…"
