"""Request-body parsers with a nesting limit (trainer.nesting): deep JSON is a 400, not a 500."""

from __future__ import annotations

import codecs
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils import json as drf_json

from trainer.nesting import MAX_DEPTH, TooDeep, loads_json


class DepthLimitedJSONParser(JSONParser):
    """DRF's JSONParser, plus: json recurses, so very deep input raised RecursionError (a 500),
    or overflowed the C stack once the recursion limit had been raised; merely deep input was
    stored and broke whoever read it later."""

    max_depth = MAX_DEPTH

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        encoding = get_encoding(parser_context or {})  # DRF's: text codecs only
        parse_constant = drf_json.strict_constant if self.strict else None
        try:
            text = codecs.getreader(encoding)(stream).read()
            return loads_json(text, self.max_depth, parse_constant=parse_constant)
        except TooDeep:
            raise ParseError(
                f"JSON parse error - the body is nested deeper than {self.max_depth} levels."
            ) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
