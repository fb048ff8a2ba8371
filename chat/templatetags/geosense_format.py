"""Template filters for GeoSense's measures: `{{ value|meters }}`, `{{ value|hectares }}` …

Thin wrappers over `chat.markup.formatting`, so templates and the markup renderer agree.
"""

from django import template

from chat.markup.formatting import (
    format_area,
    format_credits,
    format_length,
    format_overlap,
    format_pixels,
    format_position,
)

register = template.Library()

register.filter("meters", format_length, is_safe=False)
register.filter("square_meters", format_area, is_safe=False)
register.filter("overlap_percent", format_overlap, is_safe=False)
register.filter("credits", format_credits, is_safe=False)
register.filter("pixels", format_pixels, is_safe=False)
register.filter("latlon", format_position, is_safe=False)
