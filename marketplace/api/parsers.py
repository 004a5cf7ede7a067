"""Request-body parsers with a nesting limit (trainer.nesting): deep JSON is a 400, not a 500."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from trainer.nesting import MAX_DEPTH, TooDeep, check_depth


class DepthLimitedJSONParser(JSONParser):
    """DRF's JSONParser, plus: json recurses, so very deep input raised RecursionError (a 500);
    merely deep input was stored and broke whoever read it later."""

    max_depth = MAX_DEPTH

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
            check_depth(data, self.max_depth)
        except (RecursionError, TooDeep):
            raise ParseError(
                f"JSON parse error - the body is nested deeper than {self.max_depth} levels."
            ) from None
        return data
