"""Runs ``gcp-storage-emulator`` (``python tests/_gcs_emulator.py start --port N ...``, its own arguments) with two
things Cloud Storage does and the emulator does not, both of which TensorStore's gcs driver relies on:

- the ``x-goog-generation`` and ``x-goog-metageneration`` headers of a media download
  (https://cloud.google.com/storage/docs/xml-api/reference-headers#xgooggeneration): TensorStore reads an object's
  generation from them, and its OCDBT reader refuses a response without one ("Malformed StorageGeneration");
- the ``startOffset`` / ``endOffset`` parameters of an object listing (https://cloud.google.com/storage/docs/json_api/
  v1/objects/list): TensorStore lists a key range with them and aborts on a name outside it.

Everything else is the emulator's own.
"""

from __future__ import annotations

import json
import sys

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj.get("metageneration", 1))
    except (NotFound, KeyError):
        pass
    return _download(request, response, storage, *args, **kwargs)


_ls = objects.ls


def _ls_in_offsets(request, response, storage, *args, **kwargs):
    _ls(request, response, storage, *args, **kwargs)
    start = (request.query.get("startOffset") or [""])[0]
    end = (request.query.get("endOffset") or [None])[0]
    content = getattr(response, "_content", None)
    if (start or end) and content:
        listing = json.loads(content)
        listing["items"] = [
            o for o in listing.get("items", []) if o["name"] >= start and (end is None or o["name"] < end)
        ]
        response.json(listing)


# Before the server module builds its routing table from them.
objects.download = _download_with_generation
objects.ls = _ls_in_offsets

from gcp_storage_emulator.__main__ import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
