import datetime

from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetBucketRequest(_message.Message):
    __slots__ = ("name", "if_metageneration_match", "if_metageneration_not_match", "read_mask")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    READ_MASK_FIELD_NUMBER: _ClassVar[int]
    name: str
    if_metageneration_match: int
    if_metageneration_not_match: int
    read_mask: _field_mask_pb2.FieldMask
    def __init__(self, name: _Optional[str] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., read_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("name", "bucket_id", "etag", "project", "metageneration", "location", "location_type", "storage_class", "rpo", "create_time", "update_time", "labels", "iam_config", "custom_placement_config", "hierarchical_namespace")
    class IamConfig(_message.Message):
        __slots__ = ("uniform_bucket_level_access", "public_access_prevention")
        class UniformBucketLevelAccess(_message.Message):
            __slots__ = ("enabled", "lock_time")
            ENABLED_FIELD_NUMBER: _ClassVar[int]
            LOCK_TIME_FIELD_NUMBER: _ClassVar[int]
            enabled: bool
            lock_time: _timestamp_pb2.Timestamp
            def __init__(self, enabled: _Optional[bool] = ..., lock_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
        UNIFORM_BUCKET_LEVEL_ACCESS_FIELD_NUMBER: _ClassVar[int]
        PUBLIC_ACCESS_PREVENTION_FIELD_NUMBER: _ClassVar[int]
        uniform_bucket_level_access: Bucket.IamConfig.UniformBucketLevelAccess
        public_access_prevention: str
        def __init__(self, uniform_bucket_level_access: _Optional[_Union[Bucket.IamConfig.UniformBucketLevelAccess, _Mapping]] = ..., public_access_prevention: _Optional[str] = ...) -> None: ...
    class CustomPlacementConfig(_message.Message):
        __slots__ = ("data_locations",)
        DATA_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
        data_locations: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, data_locations: _Optional[_Iterable[str]] = ...) -> None: ...
    class HierarchicalNamespace(_message.Message):
        __slots__ = ("enabled",)
        ENABLED_FIELD_NUMBER: _ClassVar[int]
        enabled: bool
        def __init__(self, enabled: _Optional[bool] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUCKET_ID_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    METAGENERATION_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    LOCATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_CLASS_FIELD_NUMBER: _ClassVar[int]
    RPO_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IAM_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_PLACEMENT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    HIERARCHICAL_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    bucket_id: str
    etag: str
    project: str
    metageneration: int
    location: str
    location_type: str
    storage_class: str
    rpo: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    iam_config: Bucket.IamConfig
    custom_placement_config: Bucket.CustomPlacementConfig
    hierarchical_namespace: Bucket.HierarchicalNamespace
    def __init__(self, name: _Optional[str] = ..., bucket_id: _Optional[str] = ..., etag: _Optional[str] = ..., project: _Optional[str] = ..., metageneration: _Optional[int] = ..., location: _Optional[str] = ..., location_type: _Optional[str] = ..., storage_class: _Optional[str] = ..., rpo: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., iam_config: _Optional[_Union[Bucket.IamConfig, _Mapping]] = ..., custom_placement_config: _Optional[_Union[Bucket.CustomPlacementConfig, _Mapping]] = ..., hierarchical_namespace: _Optional[_Union[Bucket.HierarchicalNamespace, _Mapping]] = ...) -> None: ...

class Owner(_message.Message):
    __slots__ = ("entity", "entity_id")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    entity: str
    entity_id: str
    def __init__(self, entity: _Optional[str] = ..., entity_id: _Optional[str] = ...) -> None: ...

class ObjectChecksums(_message.Message):
    __slots__ = ("crc32c", "md5_hash")
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    MD5_HASH_FIELD_NUMBER: _ClassVar[int]
    crc32c: int
    md5_hash: bytes
    def __init__(self, crc32c: _Optional[int] = ..., md5_hash: _Optional[bytes] = ...) -> None: ...

class ChecksummedData(_message.Message):
    __slots__ = ("content", "crc32c")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    crc32c: int
    def __init__(self, content: _Optional[bytes] = ..., crc32c: _Optional[int] = ...) -> None: ...

class CommonObjectRequestParams(_message.Message):
    __slots__ = ("encryption_algorithm", "encryption_key_bytes", "encryption_key_sha256_bytes")
    ENCRYPTION_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_KEY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_KEY_SHA256_BYTES_FIELD_NUMBER: _ClassVar[int]
    encryption_algorithm: str
    encryption_key_bytes: bytes
    encryption_key_sha256_bytes: bytes
    def __init__(self, encryption_algorithm: _Optional[str] = ..., encryption_key_bytes: _Optional[bytes] = ..., encryption_key_sha256_bytes: _Optional[bytes] = ...) -> None: ...

class ContentRange(_message.Message):
    __slots__ = ("start", "end", "complete_length")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    complete_length: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., complete_length: _Optional[int] = ...) -> None: ...

class Object(_message.Message):
    __slots__ = ("name", "bucket", "etag", "generation", "restore_token", "metageneration", "storage_class", "size", "content_encoding", "content_disposition", "cache_control", "content_language", "delete_time", "finalize_time", "content_type", "create_time", "component_count", "checksums", "update_time", "kms_key", "update_storage_class_time", "temporary_hold", "retention_expire_time", "metadata", "event_based_hold", "owner", "custom_time", "soft_delete_time", "hard_delete_time")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESTORE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    METAGENERATION_FIELD_NUMBER: _ClassVar[int]
    STORAGE_CLASS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    CONTENT_DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    CACHE_CONTROL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DELETE_TIME_FIELD_NUMBER: _ClassVar[int]
    FINALIZE_TIME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    KMS_KEY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_STORAGE_CLASS_TIME_FIELD_NUMBER: _ClassVar[int]
    TEMPORARY_HOLD_FIELD_NUMBER: _ClassVar[int]
    RETENTION_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EVENT_BASED_HOLD_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_TIME_FIELD_NUMBER: _ClassVar[int]
    SOFT_DELETE_TIME_FIELD_NUMBER: _ClassVar[int]
    HARD_DELETE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    bucket: str
    etag: str
    generation: int
    restore_token: str
    metageneration: int
    storage_class: str
    size: int
    content_encoding: str
    content_disposition: str
    cache_control: str
    content_language: str
    delete_time: _timestamp_pb2.Timestamp
    finalize_time: _timestamp_pb2.Timestamp
    content_type: str
    create_time: _timestamp_pb2.Timestamp
    component_count: int
    checksums: ObjectChecksums
    update_time: _timestamp_pb2.Timestamp
    kms_key: str
    update_storage_class_time: _timestamp_pb2.Timestamp
    temporary_hold: bool
    retention_expire_time: _timestamp_pb2.Timestamp
    metadata: _containers.ScalarMap[str, str]
    event_based_hold: bool
    owner: Owner
    custom_time: _timestamp_pb2.Timestamp
    soft_delete_time: _timestamp_pb2.Timestamp
    hard_delete_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., bucket: _Optional[str] = ..., etag: _Optional[str] = ..., generation: _Optional[int] = ..., restore_token: _Optional[str] = ..., metageneration: _Optional[int] = ..., storage_class: _Optional[str] = ..., size: _Optional[int] = ..., content_encoding: _Optional[str] = ..., content_disposition: _Optional[str] = ..., cache_control: _Optional[str] = ..., content_language: _Optional[str] = ..., delete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finalize_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., content_type: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., component_count: _Optional[int] = ..., checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kms_key: _Optional[str] = ..., update_storage_class_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., temporary_hold: _Optional[bool] = ..., retention_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., event_based_hold: _Optional[bool] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., custom_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., soft_delete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., hard_delete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetObjectRequest(_message.Message):
    __slots__ = ("bucket", "object", "generation", "soft_deleted", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match", "common_object_request_params", "read_mask", "restore_token")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SOFT_DELETED_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    READ_MASK_FIELD_NUMBER: _ClassVar[int]
    RESTORE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    object: str
    generation: int
    soft_deleted: bool
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    common_object_request_params: CommonObjectRequestParams
    read_mask: _field_mask_pb2.FieldMask
    restore_token: str
    def __init__(self, bucket: _Optional[str] = ..., object: _Optional[str] = ..., generation: _Optional[int] = ..., soft_deleted: _Optional[bool] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ..., read_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., restore_token: _Optional[str] = ...) -> None: ...

class DeleteObjectRequest(_message.Message):
    __slots__ = ("bucket", "object", "generation", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match", "common_object_request_params")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    object: str
    generation: int
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    common_object_request_params: CommonObjectRequestParams
    def __init__(self, bucket: _Optional[str] = ..., object: _Optional[str] = ..., generation: _Optional[int] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ...) -> None: ...

class UpdateObjectRequest(_message.Message):
    __slots__ = ("object", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match", "predefined_acl", "update_mask", "common_object_request_params", "override_unlocked_retention")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    PREDEFINED_ACL_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_UNLOCKED_RETENTION_FIELD_NUMBER: _ClassVar[int]
    object: Object
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    predefined_acl: str
    update_mask: _field_mask_pb2.FieldMask
    common_object_request_params: CommonObjectRequestParams
    override_unlocked_retention: bool
    def __init__(self, object: _Optional[_Union[Object, _Mapping]] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., predefined_acl: _Optional[str] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ..., override_unlocked_retention: _Optional[bool] = ...) -> None: ...

class MoveObjectRequest(_message.Message):
    __slots__ = ("bucket", "source_object", "destination_object", "if_source_generation_match", "if_source_generation_not_match", "if_source_metageneration_match", "if_source_metageneration_not_match", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OBJECT_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_OBJECT_FIELD_NUMBER: _ClassVar[int]
    IF_SOURCE_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_SOURCE_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_SOURCE_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_SOURCE_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    source_object: str
    destination_object: str
    if_source_generation_match: int
    if_source_generation_not_match: int
    if_source_metageneration_match: int
    if_source_metageneration_not_match: int
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    def __init__(self, bucket: _Optional[str] = ..., source_object: _Optional[str] = ..., destination_object: _Optional[str] = ..., if_source_generation_match: _Optional[int] = ..., if_source_generation_not_match: _Optional[int] = ..., if_source_metageneration_match: _Optional[int] = ..., if_source_metageneration_not_match: _Optional[int] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ...) -> None: ...

class ComposeObjectRequest(_message.Message):
    __slots__ = ("destination", "source_objects", "destination_predefined_acl", "if_generation_match", "if_metageneration_match", "kms_key", "common_object_request_params", "object_checksums", "delete_source_objects")
    class SourceObject(_message.Message):
        __slots__ = ("name", "generation", "object_preconditions")
        class ObjectPreconditions(_message.Message):
            __slots__ = ("if_generation_match",)
            IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
            if_generation_match: int
            def __init__(self, if_generation_match: _Optional[int] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        GENERATION_FIELD_NUMBER: _ClassVar[int]
        OBJECT_PRECONDITIONS_FIELD_NUMBER: _ClassVar[int]
        name: str
        generation: int
        object_preconditions: ComposeObjectRequest.SourceObject.ObjectPreconditions
        def __init__(self, name: _Optional[str] = ..., generation: _Optional[int] = ..., object_preconditions: _Optional[_Union[ComposeObjectRequest.SourceObject.ObjectPreconditions, _Mapping]] = ...) -> None: ...
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_PREDEFINED_ACL_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    KMS_KEY_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    DELETE_SOURCE_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    destination: Object
    source_objects: _containers.RepeatedCompositeFieldContainer[ComposeObjectRequest.SourceObject]
    destination_predefined_acl: str
    if_generation_match: int
    if_metageneration_match: int
    kms_key: str
    common_object_request_params: CommonObjectRequestParams
    object_checksums: ObjectChecksums
    delete_source_objects: bool
    def __init__(self, destination: _Optional[_Union[Object, _Mapping]] = ..., source_objects: _Optional[_Iterable[_Union[ComposeObjectRequest.SourceObject, _Mapping]]] = ..., destination_predefined_acl: _Optional[str] = ..., if_generation_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., kms_key: _Optional[str] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ..., object_checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ..., delete_source_objects: _Optional[bool] = ...) -> None: ...

class ListObjectsRequest(_message.Message):
    __slots__ = ("parent", "page_size", "page_token", "delimiter", "include_trailing_delimiter", "prefix", "versions", "read_mask", "lexicographic_start", "lexicographic_end", "soft_deleted", "include_folders_as_prefixes", "match_glob", "filter")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DELIMITER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TRAILING_DELIMITER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    READ_MASK_FIELD_NUMBER: _ClassVar[int]
    LEXICOGRAPHIC_START_FIELD_NUMBER: _ClassVar[int]
    LEXICOGRAPHIC_END_FIELD_NUMBER: _ClassVar[int]
    SOFT_DELETED_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FOLDERS_AS_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    MATCH_GLOB_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    parent: str
    page_size: int
    page_token: str
    delimiter: str
    include_trailing_delimiter: bool
    prefix: str
    versions: bool
    read_mask: _field_mask_pb2.FieldMask
    lexicographic_start: str
    lexicographic_end: str
    soft_deleted: bool
    include_folders_as_prefixes: bool
    match_glob: str
    filter: str
    def __init__(self, parent: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., delimiter: _Optional[str] = ..., include_trailing_delimiter: _Optional[bool] = ..., prefix: _Optional[str] = ..., versions: _Optional[bool] = ..., read_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., lexicographic_start: _Optional[str] = ..., lexicographic_end: _Optional[str] = ..., soft_deleted: _Optional[bool] = ..., include_folders_as_prefixes: _Optional[bool] = ..., match_glob: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class ListObjectsResponse(_message.Message):
    __slots__ = ("objects", "prefixes", "next_page_token")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[Object]
    prefixes: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, objects: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., prefixes: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReadObjectRequest(_message.Message):
    __slots__ = ("bucket", "object", "generation", "read_offset", "read_limit", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match", "common_object_request_params", "read_mask")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    READ_OFFSET_FIELD_NUMBER: _ClassVar[int]
    READ_LIMIT_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    READ_MASK_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    object: str
    generation: int
    read_offset: int
    read_limit: int
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    common_object_request_params: CommonObjectRequestParams
    read_mask: _field_mask_pb2.FieldMask
    def __init__(self, bucket: _Optional[str] = ..., object: _Optional[str] = ..., generation: _Optional[int] = ..., read_offset: _Optional[int] = ..., read_limit: _Optional[int] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ..., read_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class ReadObjectResponse(_message.Message):
    __slots__ = ("checksummed_data", "object_checksums", "content_range", "metadata")
    CHECKSUMMED_DATA_FIELD_NUMBER: _ClassVar[int]
    OBJECT_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_RANGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    checksummed_data: ChecksummedData
    object_checksums: ObjectChecksums
    content_range: ContentRange
    metadata: Object
    def __init__(self, checksummed_data: _Optional[_Union[ChecksummedData, _Mapping]] = ..., object_checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ..., content_range: _Optional[_Union[ContentRange, _Mapping]] = ..., metadata: _Optional[_Union[Object, _Mapping]] = ...) -> None: ...

class WriteObjectSpec(_message.Message):
    __slots__ = ("resource", "predefined_acl", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match", "object_size", "appendable")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PREDEFINED_ACL_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    OBJECT_SIZE_FIELD_NUMBER: _ClassVar[int]
    APPENDABLE_FIELD_NUMBER: _ClassVar[int]
    resource: Object
    predefined_acl: str
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    object_size: int
    appendable: bool
    def __init__(self, resource: _Optional[_Union[Object, _Mapping]] = ..., predefined_acl: _Optional[str] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., object_size: _Optional[int] = ..., appendable: _Optional[bool] = ...) -> None: ...

class WriteObjectRequest(_message.Message):
    __slots__ = ("upload_id", "write_object_spec", "write_offset", "checksummed_data", "object_checksums", "finish_write", "common_object_request_params")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_OBJECT_SPEC_FIELD_NUMBER: _ClassVar[int]
    WRITE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMMED_DATA_FIELD_NUMBER: _ClassVar[int]
    OBJECT_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    FINISH_WRITE_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    write_object_spec: WriteObjectSpec
    write_offset: int
    checksummed_data: ChecksummedData
    object_checksums: ObjectChecksums
    finish_write: bool
    common_object_request_params: CommonObjectRequestParams
    def __init__(self, upload_id: _Optional[str] = ..., write_object_spec: _Optional[_Union[WriteObjectSpec, _Mapping]] = ..., write_offset: _Optional[int] = ..., checksummed_data: _Optional[_Union[ChecksummedData, _Mapping]] = ..., object_checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ..., finish_write: _Optional[bool] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ...) -> None: ...

class WriteObjectResponse(_message.Message):
    __slots__ = ("persisted_size", "resource", "persisted_data_checksums")
    PERSISTED_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_DATA_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    persisted_size: int
    resource: Object
    persisted_data_checksums: ObjectChecksums
    def __init__(self, persisted_size: _Optional[int] = ..., resource: _Optional[_Union[Object, _Mapping]] = ..., persisted_data_checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ...) -> None: ...

class BidiReadHandle(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    def __init__(self, handle: _Optional[bytes] = ...) -> None: ...

class BidiReadObjectSpec(_message.Message):
    __slots__ = ("bucket", "object", "generation", "if_generation_match", "if_generation_not_match", "if_metageneration_match", "if_metageneration_not_match", "common_object_request_params", "read_mask", "read_handle", "routing_token")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    READ_MASK_FIELD_NUMBER: _ClassVar[int]
    READ_HANDLE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    object: str
    generation: int
    if_generation_match: int
    if_generation_not_match: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    common_object_request_params: CommonObjectRequestParams
    read_mask: _field_mask_pb2.FieldMask
    read_handle: BidiReadHandle
    routing_token: str
    def __init__(self, bucket: _Optional[str] = ..., object: _Optional[str] = ..., generation: _Optional[int] = ..., if_generation_match: _Optional[int] = ..., if_generation_not_match: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ..., read_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., read_handle: _Optional[_Union[BidiReadHandle, _Mapping]] = ..., routing_token: _Optional[str] = ...) -> None: ...

class ReadRange(_message.Message):
    __slots__ = ("read_offset", "read_length", "read_id")
    READ_OFFSET_FIELD_NUMBER: _ClassVar[int]
    READ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    READ_ID_FIELD_NUMBER: _ClassVar[int]
    read_offset: int
    read_length: int
    read_id: int
    def __init__(self, read_offset: _Optional[int] = ..., read_length: _Optional[int] = ..., read_id: _Optional[int] = ...) -> None: ...

class BidiReadObjectRequest(_message.Message):
    __slots__ = ("read_object_spec", "read_ranges")
    READ_OBJECT_SPEC_FIELD_NUMBER: _ClassVar[int]
    READ_RANGES_FIELD_NUMBER: _ClassVar[int]
    read_object_spec: BidiReadObjectSpec
    read_ranges: _containers.RepeatedCompositeFieldContainer[ReadRange]
    def __init__(self, read_object_spec: _Optional[_Union[BidiReadObjectSpec, _Mapping]] = ..., read_ranges: _Optional[_Iterable[_Union[ReadRange, _Mapping]]] = ...) -> None: ...

class ObjectRangeData(_message.Message):
    __slots__ = ("checksummed_data", "read_range", "range_end")
    CHECKSUMMED_DATA_FIELD_NUMBER: _ClassVar[int]
    READ_RANGE_FIELD_NUMBER: _ClassVar[int]
    RANGE_END_FIELD_NUMBER: _ClassVar[int]
    checksummed_data: ChecksummedData
    read_range: ReadRange
    range_end: bool
    def __init__(self, checksummed_data: _Optional[_Union[ChecksummedData, _Mapping]] = ..., read_range: _Optional[_Union[ReadRange, _Mapping]] = ..., range_end: _Optional[bool] = ...) -> None: ...

class BidiReadObjectResponse(_message.Message):
    __slots__ = ("object_data_ranges", "metadata", "read_handle")
    OBJECT_DATA_RANGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    READ_HANDLE_FIELD_NUMBER: _ClassVar[int]
    object_data_ranges: _containers.RepeatedCompositeFieldContainer[ObjectRangeData]
    metadata: Object
    read_handle: BidiReadHandle
    def __init__(self, object_data_ranges: _Optional[_Iterable[_Union[ObjectRangeData, _Mapping]]] = ..., metadata: _Optional[_Union[Object, _Mapping]] = ..., read_handle: _Optional[_Union[BidiReadHandle, _Mapping]] = ...) -> None: ...

class BidiReadObjectRedirectedError(_message.Message):
    __slots__ = ("read_handle", "routing_token")
    READ_HANDLE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    read_handle: BidiReadHandle
    routing_token: str
    def __init__(self, read_handle: _Optional[_Union[BidiReadHandle, _Mapping]] = ..., routing_token: _Optional[str] = ...) -> None: ...

class ReadRangeError(_message.Message):
    __slots__ = ("read_id", "status")
    READ_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    read_id: int
    status: _status_pb2.Status
    def __init__(self, read_id: _Optional[int] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class BidiReadObjectError(_message.Message):
    __slots__ = ("read_range_errors",)
    READ_RANGE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    read_range_errors: _containers.RepeatedCompositeFieldContainer[ReadRangeError]
    def __init__(self, read_range_errors: _Optional[_Iterable[_Union[ReadRangeError, _Mapping]]] = ...) -> None: ...

class BidiWriteHandle(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    def __init__(self, handle: _Optional[bytes] = ...) -> None: ...

class AppendObjectSpec(_message.Message):
    __slots__ = ("bucket", "object", "generation", "if_metageneration_match", "if_metageneration_not_match", "routing_token", "write_handle")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_MATCH_FIELD_NUMBER: _ClassVar[int]
    IF_METAGENERATION_NOT_MATCH_FIELD_NUMBER: _ClassVar[int]
    ROUTING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WRITE_HANDLE_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    object: str
    generation: int
    if_metageneration_match: int
    if_metageneration_not_match: int
    routing_token: str
    write_handle: BidiWriteHandle
    def __init__(self, bucket: _Optional[str] = ..., object: _Optional[str] = ..., generation: _Optional[int] = ..., if_metageneration_match: _Optional[int] = ..., if_metageneration_not_match: _Optional[int] = ..., routing_token: _Optional[str] = ..., write_handle: _Optional[_Union[BidiWriteHandle, _Mapping]] = ...) -> None: ...

class BidiWriteObjectRequest(_message.Message):
    __slots__ = ("upload_id", "write_object_spec", "append_object_spec", "write_offset", "checksummed_data", "object_checksums", "state_lookup", "flush", "finish_write", "common_object_request_params")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_OBJECT_SPEC_FIELD_NUMBER: _ClassVar[int]
    APPEND_OBJECT_SPEC_FIELD_NUMBER: _ClassVar[int]
    WRITE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMMED_DATA_FIELD_NUMBER: _ClassVar[int]
    OBJECT_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    STATE_LOOKUP_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    FINISH_WRITE_FIELD_NUMBER: _ClassVar[int]
    COMMON_OBJECT_REQUEST_PARAMS_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    write_object_spec: WriteObjectSpec
    append_object_spec: AppendObjectSpec
    write_offset: int
    checksummed_data: ChecksummedData
    object_checksums: ObjectChecksums
    state_lookup: bool
    flush: bool
    finish_write: bool
    common_object_request_params: CommonObjectRequestParams
    def __init__(self, upload_id: _Optional[str] = ..., write_object_spec: _Optional[_Union[WriteObjectSpec, _Mapping]] = ..., append_object_spec: _Optional[_Union[AppendObjectSpec, _Mapping]] = ..., write_offset: _Optional[int] = ..., checksummed_data: _Optional[_Union[ChecksummedData, _Mapping]] = ..., object_checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ..., state_lookup: _Optional[bool] = ..., flush: _Optional[bool] = ..., finish_write: _Optional[bool] = ..., common_object_request_params: _Optional[_Union[CommonObjectRequestParams, _Mapping]] = ...) -> None: ...

class BidiWriteObjectResponse(_message.Message):
    __slots__ = ("persisted_size", "resource", "persisted_data_checksums", "write_handle")
    PERSISTED_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_DATA_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_HANDLE_FIELD_NUMBER: _ClassVar[int]
    persisted_size: int
    resource: Object
    persisted_data_checksums: ObjectChecksums
    write_handle: BidiWriteHandle
    def __init__(self, persisted_size: _Optional[int] = ..., resource: _Optional[_Union[Object, _Mapping]] = ..., persisted_data_checksums: _Optional[_Union[ObjectChecksums, _Mapping]] = ..., write_handle: _Optional[_Union[BidiWriteHandle, _Mapping]] = ...) -> None: ...

class BidiWriteObjectRedirectedError(_message.Message):
    __slots__ = ("routing_token", "write_handle", "generation")
    ROUTING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WRITE_HANDLE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    routing_token: str
    write_handle: BidiWriteHandle
    generation: int
    def __init__(self, routing_token: _Optional[str] = ..., write_handle: _Optional[_Union[BidiWriteHandle, _Mapping]] = ..., generation: _Optional[int] = ...) -> None: ...
