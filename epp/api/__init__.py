"""OpenAI-style request and response bodies: parsing (msgspec), usage extraction, model rewrite."""
