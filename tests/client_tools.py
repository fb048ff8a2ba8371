"""Client-tool declarations the socket and engine tests register, defined once."""

LOCATION = {
    "kind": "blocking",
    "name": "location_get",
    "description": "The user's position; accuracy is a radius in metres.",
    "arguments": {"type": "object", "properties": {}, "additionalProperties": False},
    "result": {
        "type": "object",
        "properties": {"status": {"type": "string"}, "accuracy": {"type": "number"}},
        "required": ["status"],
    },
    "serve": True,
}
FOCUS = {
    "kind": "one-way",
    "name": "map_focus",
    "title": "Show annotations on the map",
    "summary": "{ids:ids}",
    "description": "Pan and zoom the map to annotations.",
    "arguments": {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
        "required": ["ids"],
    },
}
PICK = {
    "kind": "blocking",
    "name": "map_select",
    "description": "The user picks annotations on the map and confirms.",
    "arguments": {"type": "object", "properties": {"prompt": {"type": "string"}}},
    "result": {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
        "required": ["ids"],
    },
}
