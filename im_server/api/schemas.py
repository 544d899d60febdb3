"""Request bodies (pydantic) of the REST API; their examples feed the OpenAPI page."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class NewUser(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"username": "alice", "password": "correct horse"}]}
    )
    username: Any = Field(
        description="3-32 characters (NFKC; a wide character counts as two) of Unicode "
        "letters, marks, digits, '_', '.', '-'; unique regardless of case"
    )
    password: Any = Field(description="8-256 characters")
    display_name: Any = None


class NewSession(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"username": "alice", "password": "correct horse", "device_id": "phone"}]
        }
    )
    username: Any
    password: Any
    device_id: Any = None


class PasswordChange(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"old_password": "correct horse", "new_password": "battery staple"}]
        }
    )
    old_password: Any
    new_password: Any = Field(description="8-256 characters")


class FriendRequestBody(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"to_user_id": 2, "note": "hi, it's Alice"}]}
    )
    to_user_id: Any
    note: Any = None


class NewGroup(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "team", "member_ids": [2, 3]}]}
    )
    name: Any
    member_ids: Any = Field(default_factory=list)


class AddMembers(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"user_ids": [4], "with_history": False}]}
    )
    user_ids: Any
    with_history: Any = False


class SendBody(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "client_msg_id": "6f1c2b0e9a",
                    "content_type": "text",
                    "content": {"text": "hello"},
                }
            ]
        }
    )
    client_msg_id: Any
    content_type: Any = "text"
    content: Any = None


class ReadBody(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"seq": 42}]})
    seq: Any


class RoleBody(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"role": "admin"}]})
    role: Any
