"""moto's S3 server for the knowledge tests: the bucket, its credentials, what kb.uri needs.

The `s3_server` fixture (tests/conftest.py) starts the server; these helpers talk to it.
"""

from __future__ import annotations

from typing import Any

BUCKET = "ania-kb"
KEY_ID, SECRET_KEY = "test-key-id", "test-secret-access-key-0042"


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client of the server at ``endpoint``."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )


def s3_options(endpoint: str) -> dict[str, str]:
    """``kb.storage_options`` for the server at ``endpoint``."""
    return {
        "aws_endpoint": endpoint,
        "aws_region": "us-east-1",
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET_KEY,
        "allow_http": "true",
    }


def bucket_keys(endpoint: str) -> list[str]:
    """Every object key in the bucket."""
    client = s3_client(endpoint)
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]
    finally:
        client.close()
