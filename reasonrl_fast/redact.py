"""Secrets kept out of what the package writes and prints: the GenRM's bearer key
(`fapo.genrm.api_key`) and the user:password part of a URL (a GenRM address
`http://user:pass@host:port/v1`, a `ray://user:pass@host` address). The one rule for a run's
config.yaml, for error messages that echo a setting, and for warnings that name an address.
Pure functions, without torch or the config, so anything may import them."""

from __future__ import annotations

import re
from urllib.parse import unquote

REDACTED = "<redacted>"
"""What stands in for a secret. The settings refuse it as a value (config/validate.py), so a config.yaml
written with it cannot be loaded back as if it held the real key or password."""

SECRET_KEYS = frozenset({"fapo.genrm.api_key"})
"""Settings whose whole value is a secret."""

URL_KEYS = frozenset({"fapo.genrm.addresses"})
"""Settings holding addresses that may carry user:password, with or without a scheme."""

# user:password@ after a scheme, up to the last @ before the host (a password may hold '@'; '/',
# '?' and '#' end the authority, and whitespace or a quote ends the URL in a message)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"]*@")

SECRET_MIN_CHARS = 4
"""Secrets shorter than this are not searched for in free text (`hide`: they would blank out
common words); URLs lose their user:password by `redact_url` whatever its length."""


def redact_url(url: str) -> str:
    """`url` with everything between its scheme and the last '@' before its query replaced by
    REDACTED (a bare `user:pass@host:port` counts too); a URL without such an '@' is returned as
    it is. The last '@', not the authority's end: a password may hold an unencoded '/' (where
    urlsplit would end the credentials early and leave the rest in the path), and no address the
    settings hold has an '@' of its own, so the worst this does is hide a path."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    if "@" not in rest[:end]:
        return url
    return f"{scheme}{sep}{REDACTED}@{rest[:end].rpartition('@')[2]}{rest[end:]}"


def secrets_of(addresses, *keys: str) -> list[str]:
    """The strings `hide` searches free text for, for these addresses and API keys: the keys, and
    each address's user:password and password as written and percent-decoded; longest first,
    none shorter than SECRET_MIN_CHARS. For texts of elsewhere (a library's exception, a server's
    error body) that may quote a secret anywhere."""
    found = set(keys)
    for a in addresses:
        a = str(a)
        rest = a.partition("://")[2] if "://" in a else a
        if "@" in rest:
            userinfo = rest.rpartition("@")[0]
            password = userinfo.partition(":")[2]
            found |= {userinfo, password, unquote(userinfo), unquote(password)}
    return sorted((s for s in found if len(s) >= SECRET_MIN_CHARS), key=len, reverse=True)


def hide(text: str, secrets: list[str]) -> str:
    """`text` with each of `secrets` (secrets_of: longest first) replaced by REDACTED."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def redact_text(text: str) -> str:
    """A message with the user:password of every `scheme://` URL in it replaced by REDACTED."""
    return _USERINFO.sub(rf"\1{REDACTED}@", text)


def redact_value(key: str, value):
    """A setting's value as it may be shown or written: REDACTED for a secret key that is set,
    URLs without their user:password (in a string, or each string of a list); else `value`."""
    if key in SECRET_KEYS:
        return REDACTED if value else value
    if isinstance(value, str):
        return redact_url(value) if key in URL_KEYS else redact_text(value)
    if isinstance(value, (list, tuple)):  # one level: no setting nests deeper
        return type(value)(redact_value(key, v) if isinstance(v, str) else v for v in value)
    return value


def redact_settings(settings: dict, at: str = "") -> dict:
    """A copy of a nested settings mapping ({"fapo": {"genrm": {...}}, ...}) with every value
    `redact_value`d under its dotted key."""
    return {k: redact_settings(v, f"{at}{k}.") if isinstance(v, dict) else redact_value(f"{at}{k}", v)
            for k, v in settings.items()}


def holds_redacted(value) -> bool:
    """Whether a value (or a string of a list) carries REDACTED: read back from a config.yaml."""
    if isinstance(value, (list, tuple)):
        return any(holds_redacted(v) for v in value)
    return isinstance(value, str) and REDACTED in value
