"""The admin endpoints: what the site's own CLI asks of its running server, signed with the site's
own key (only one process may write a store, so writes go through the server while it runs)."""

from __future__ import annotations

import datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from knowledge import Role

from ._endpoint import endpoint, error_response
from ._errors import FederationError, WireError
from ._site import Site
from ._wire import check_hex64, parse_json


@endpoint("admin")
async def admin_sync(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Run a sync round now, with one named peer or with every peer (this site's key only).
    requestBody: {content: {application/json: {example: {"peer": "site-b"}}}}
    """
    data = parse_json(body or b"{}")
    name = data.get("peer") if isinstance(data, dict) else None
    if site.gossip is None:
        return error_response(409, "no_gossip", "this server runs without a gossip scheduler")
    try:
        reports = await site.gossip.sync_now(name)
    except FederationError as exc:
        return error_response(404, "unknown_peer", str(exc))
    return JSONResponse({"reports": reports})


@endpoint("admin")
async def admin_revoke(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Revoke a skill as this site (this site's key only).
    requestBody: {content: {application/json: {example: {"skill": "<64 hex>", "reason": "..."}}}}
    """
    data = parse_json(body)
    if not isinstance(data, dict) or not isinstance(data.get("skill"), str):
        raise WireError(
            "body must be a JSON object with 'skill' (64 hex digits) and optionally 'reason'"
        )
    check_hex64(data["skill"], "skill id")
    await run_in_threadpool(site.kb.revoke, data["skill"], str(data.get("reason", "")))
    return JSONResponse({"revoked": data["skill"]})


@endpoint("admin")
async def admin_delegate(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Delegate roles to a device key (this site's key only), for `lasting_s` seconds by
      this site's clock if given.
    requestBody:
      content:
        application/json:
          example: {"device": "<64 hex>", "roles": ["publish"], "lasting_s": 28800}
    """
    data = parse_json(body)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("device"), str)
        or not isinstance(data.get("roles"), list)
    ):
        raise WireError(
            "body must be a JSON object with 'device' (64 hex digits) and 'roles' (a list)"
        )
    try:
        roles = [Role(r) for r in data["roles"]]
    except ValueError as exc:
        raise WireError(f"{exc}; roles are publish, validate, revoke") from None
    lasting_s = data.get("lasting_s")
    if lasting_s is not None and (
        isinstance(lasting_s, bool)
        or not isinstance(lasting_s, int | float)
        or not 0 < lasting_s < float("inf")
    ):
        raise WireError(f"'lasting_s' must be a number of seconds > 0, got {lasting_s!r}")
    lasting = None if lasting_s is None else datetime.timedelta(seconds=lasting_s)
    device = bytes.fromhex(check_hex64(data["device"], "device key"))
    await run_in_threadpool(lambda: site.kb.delegate(device, roles, lasting=lasting))
    return JSONResponse({"delegated": data["device"], "roles": [r.value for r in roles]})


@endpoint("admin")
async def admin_revoke_key(request: Request, site: Site, body: bytes, caller: bytes) -> Response:
    """
    summary: Stop accepting a device's feed after a given seq (this site's key only).
    requestBody:
      content:
        application/json: {example: {"device": "<64 hex>", "last_seq": 41, "reason": "lost"}}
    """
    data = parse_json(body)
    last_seq = data.get("last_seq") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("device"), str)
        or not isinstance(last_seq, int)
        or isinstance(last_seq, bool)
        or last_seq < 0
    ):
        raise WireError(
            "body must be a JSON object with 'device' (64 hex digits) "
            "and 'last_seq' (an integer >= 0)"
        )
    device = bytes.fromhex(check_hex64(data["device"], "device key"))
    await run_in_threadpool(site.kb.revoke_key, device, last_seq, str(data.get("reason", "")))
    return JSONResponse({"revoked_key": data["device"], "last_seq": last_seq})
