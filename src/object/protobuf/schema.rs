//! The Kubernetes protobuf schema, loaded once per process: the descriptor set
//! of every `generated.proto` of k8s.io/api and k8s.io/apimachinery
//! (`src/object/k8s-protos.desc`) in a prost-reflect [`DescriptorPool`], and
//! the Go JSON tags that differ from the default mapping
//! (`src/object/k8s-json-fields.txt`), both made by
//! `scripts/k8s-proto-descriptors.sh`. Also answers which message an
//! `apiVersion`/`kind` names and which messages only wrap a Go slice.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use prost::Message as _;
use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use prost_types::FileDescriptorSet;

use super::ProtobufError;

/// The committed descriptor set (a FileDescriptorSet).
static DESCRIPTORS: &[u8] = include_bytes!("../k8s-protos.desc");
/// The committed Go JSON tags: `<Message>.<field> <jsonName|-> [inline] [keep] [ptr] [omitzero]`.
static JSON_FIELDS: &str = include_str!("../k8s-json-fields.txt");

/// How Go's `encoding/json` writes one field, where it differs from the
/// default (JSON name = proto name, `omitempty`, not a pointer).
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldTag {
    /// The JSON name; None for `json:"-"` and for inlined embedded structs.
    pub(crate) json_name: Option<String>,
    /// An embedded struct whose fields appear in the parent's JSON object.
    pub(crate) inline: bool,
    /// No `omitempty`: a zero value is written.
    pub(crate) keep: bool,
    /// A Go pointer: a zero value that is present (non-nil) is written.
    pub(crate) pointer: bool,
    /// `omitzero`: a zero value is left out even for a struct (ObjectMeta's
    /// `creationTimestamp` since Kubernetes 1.34: no `null` in a template).
    pub(crate) omitzero: bool,
}

/// Maps and sets of the per-field lookups: SipHash over long full names was
/// a fifth of the codec's time.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<K> = HashSet<K, foldhash::fast::RandomState>;

/// Which field a JSON key of a message's object sets.
#[derive(Debug, Clone)]
pub(crate) struct JsonKey {
    pub(crate) field: FieldDescriptor,
    /// The key belongs to the struct embedded (`json:",inline"`) in `field`.
    pub(crate) embedded: bool,
}

/// Proto package of the core ("") API group.
const CORE_PACKAGE: &str = "k8s.io.api.core.v1";
/// Proto package of apimachinery's meta/v1 types (Status, WatchEvent,
/// ListOptions, APIGroup...), which Go's `metav1.AddToGroupVersion` registers
/// in every group version.
const META_PACKAGE: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";
/// The API groups' proto packages: `k8s.io.api.<dir>.<version>`, and
/// `<module>.pkg.apis.<dir>.<version>` outside apimachinery (e.g.
/// `k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1`).
fn api_group_package(package: &str) -> Option<(&str, &str)> {
    let rest = match package.strip_prefix("k8s.io.api.") {
        Some(rest) => rest,
        None if package.starts_with("k8s.io.apimachinery.") => return None,
        None => package.split_once(".pkg.apis.")?.1,
    };
    let (dir, version) = rest.split_once('.')?;
    (!version.contains('.')).then_some((dir, version))
}

/// The loaded schema; built once per process ([`Schema::get`]).
pub(crate) struct Schema {
    pool: DescriptorPool,
    /// Field full name -> its Go JSON tag, for fields that differ from the default.
    field_tags: FastMap<String, FieldTag>,
    /// Message full name -> JSON key -> the field it sets (see
    /// [`Schema::json_key`]).
    json_keys: FastMap<String, FastMap<String, JsonKey>>,
    /// Full names of messages that only wrap a Go slice (`repeated ... items`
    /// as their single field, e.g. `ExtraValue`, `Verbs`): their JSON is the list.
    slice_wrappers: FastSet<String>,
    /// Full names of the `XxxEntry` messages of map fields (their `map_entry`
    /// option is cleared at load, see [`Schema::load`]).
    map_entries: FastSet<String>,
    /// (version, kind) -> message full names in `k8s.io.api.*.<version>`, for
    /// groups whose name does not start with their package directory
    /// (`internal.apiserver.k8s.io` lives in `apiserverinternal`).
    kinds_by_version: HashMap<(String, String), Vec<String>>,
    /// (package directory, version) -> proto package of that API group version.
    group_packages: HashMap<(String, String), String>,
}

static SCHEMA: OnceLock<Result<Schema, ProtobufError>> = OnceLock::new();

impl Schema {
    /// The process-wide schema, loaded on first use.
    pub(crate) fn get() -> Result<&'static Schema, ProtobufError> {
        SCHEMA
            .get_or_init(|| Schema::load(DESCRIPTORS))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load(bytes: &[u8]) -> Result<Schema, ProtobufError> {
        let mut set =
            FileDescriptorSet::decode(bytes).map_err(|e| ProtobufError::Schema(e.to_string()))?;
        let mut map_entries = FastSet::default();
        for file in &mut set.file {
            let package = file.package.clone().unwrap_or_default();
            // Map fields become plain `repeated XxxEntry` fields (identical on
            // the wire): DynamicMessage keeps maps in a HashMap, and Go's
            // marshalers write map entries sorted by key, which a list keeps.
            for message in &mut file.message_type {
                clear_map_entry(message, &package, &mut map_entries);
            }
        }
        let pool = DescriptorPool::from_file_descriptor_set(set)
            .map_err(|e| ProtobufError::Schema(e.to_string()))?;
        let (field_tags, slice_types) = parse_field_tags(JSON_FIELDS)?;
        let mut slice_wrappers = FastSet::default();
        let mut json_keys = FastMap::default();
        let mut kinds_by_version: HashMap<(String, String), Vec<String>> = HashMap::new();
        let mut group_packages = HashMap::new();
        for message in pool.all_messages() {
            if slice_types.contains(message.full_name()) && is_slice_wrapper(&message) {
                slice_wrappers.insert(message.full_name().to_string());
            }
            json_keys.insert(
                message.full_name().to_string(),
                json_keys_of(&field_tags, &message),
            );
            let package = message.package_name();
            if let Some((dir, version)) = api_group_package(package)
                && message.parent_message().is_none()
            {
                group_packages
                    .entry((dir.to_string(), version.to_string()))
                    .or_insert_with(|| package.to_string());
                kinds_by_version
                    .entry((version.to_string(), message.name().to_string()))
                    .or_default()
                    .push(message.full_name().to_string());
            }
        }
        Ok(Schema {
            pool,
            field_tags,
            json_keys,
            slice_wrappers,
            map_entries,
            kinds_by_version,
            group_packages,
        })
    }

    #[cfg(test)]
    pub(crate) fn all_messages(&self) -> impl Iterator<Item = MessageDescriptor> + '_ {
        self.pool.all_messages()
    }

    pub(crate) fn message(&self, full_name: &str) -> Option<MessageDescriptor> {
        self.pool.get_message_by_name(full_name)
    }

    /// The message type of `apiVersion`/`kind`, as kube-apiserver's scheme
    /// resolves it: the group's package first, then meta/v1's common kinds.
    pub(crate) fn resolve(&self, api_version: &str, kind: &str) -> Option<MessageDescriptor> {
        if kind.is_empty() || kind.contains('.') {
            return None;
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        if version.is_empty() || version.contains('.') || version.contains('/') {
            return None;
        }
        let in_group = if group.is_empty() {
            (version == "v1")
                .then(|| self.message(&format!("{CORE_PACKAGE}.{kind}")))
                .flatten()
        } else {
            let dir = group.split('.').next().unwrap_or(group);
            self.group_packages
                .get(&(dir.to_string(), version.to_string()))
                .and_then(|package| self.message(&format!("{package}.{kind}")))
                .or_else(|| {
                    // A built-in group named unlike its package directory: the
                    // kind must be unique among that version's packages.
                    if !group.ends_with(".k8s.io") {
                        return None;
                    }
                    match self
                        .kinds_by_version
                        .get(&(version.to_string(), kind.to_string()))
                    {
                        Some(names) if names.len() == 1 => self.message(&names[0]),
                        _ => None,
                    }
                })
        };
        in_group.or_else(|| {
            self.message(&format!("{META_PACKAGE}.{kind}"))
                .filter(|m| META_KINDS.contains(&m.name()))
        })
    }

    /// The Go JSON tag of a field, if it differs from the default.
    pub(crate) fn field_tag(&self, field: &FieldDescriptor) -> Option<&FieldTag> {
        self.field_tags.get(field.full_name())
    }

    /// Whether `message` is the entry type of a map field (key = 1, value = 2).
    /// The field a JSON key of `message`'s object sets: the message's own
    /// fields first, then those of embedded structs (Go's rule: the
    /// shallower field wins). Precomputed per message at load, so a key costs
    /// two lookups instead of a scan of the message's fields.
    pub(crate) fn json_key(&self, message: &MessageDescriptor, key: &str) -> Option<&JsonKey> {
        self.json_keys.get(message.full_name())?.get(key)
    }

    pub(crate) fn is_map_entry(&self, message: &MessageDescriptor) -> bool {
        self.map_entries.contains(message.full_name())
    }

    pub(crate) fn is_slice_wrapper(&self, message: &MessageDescriptor) -> bool {
        self.slice_wrappers.contains(message.full_name())
    }
}

/// The meta/v1 kinds registered in every group version (Go:
/// `metav1.AddToGroupVersion` and the unversioned types of the core group).
const META_KINDS: &[&str] = &[
    "WatchEvent",
    "Status",
    "ListOptions",
    "GetOptions",
    "DeleteOptions",
    "CreateOptions",
    "UpdateOptions",
    "PatchOptions",
    "APIVersions",
    "APIGroupList",
    "APIGroup",
    "APIResourceList",
    "Table",
    "PartialObjectMetadata",
    "PartialObjectMetadataList",
];

/// go-to-protobuf wraps a named Go slice type (`type ExtraValue []string`) in
/// a message whose single field is `repeated ... items`; its JSON is the list.
fn is_slice_wrapper(message: &MessageDescriptor) -> bool {
    let mut fields = message.fields();
    match (fields.next(), fields.next()) {
        (Some(f), None) => f.name() == "items" && f.is_list(),
        _ => false,
    }
}

/// Every JSON key of `message`'s object and the field it sets (see
/// [`Schema::json_key`]); embedded structs are followed recursively.
fn json_keys_of(
    tags: &FastMap<String, FieldTag>,
    message: &MessageDescriptor,
) -> FastMap<String, JsonKey> {
    let mut keys = FastMap::default();
    let mut inline = Vec::new();
    for field in message.fields() {
        let name = match tags.get(field.full_name()) {
            Some(tag) if tag.inline => {
                inline.push(field);
                continue;
            }
            Some(tag) => match &tag.json_name {
                Some(n) => n.clone(),
                None => continue,
            },
            None => field.name().to_string(),
        };
        keys.entry(name).or_insert(JsonKey {
            field,
            embedded: false,
        });
    }
    for field in inline {
        if let Kind::Message(inner) = field.kind() {
            for key in json_keys_of(tags, &inner).into_keys() {
                keys.entry(key).or_insert_with(|| JsonKey {
                    field: field.clone(),
                    embedded: true,
                });
            }
        }
    }
    keys
}

fn clear_map_entry(
    message: &mut prost_types::DescriptorProto,
    scope: &str,
    map_entries: &mut FastSet<String>,
) {
    let name = format!("{scope}.{}", message.name.as_deref().unwrap_or(""));
    if let Some(options) = message.options.as_mut()
        && options.map_entry.take() == Some(true)
    {
        map_entries.insert(name.clone());
    }
    for nested in &mut message.nested_type {
        clear_map_entry(nested, &name, map_entries);
    }
}

/// The tags file: field tags, and the names of messages that wrap a named Go
/// slice type (`<Message> - slice`).
type ParsedTags = (FastMap<String, FieldTag>, FastSet<String>);

fn parse_field_tags(text: &str) -> Result<ParsedTags, ProtobufError> {
    let mut tags = FastMap::default();
    let mut slices = FastSet::default();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let mut words = line.split_whitespace();
        let (Some(field), Some(json_name)) = (words.next(), words.next()) else {
            return Err(ProtobufError::Schema(format!("bad JSON tag line {line:?}")));
        };
        let mut tag = FieldTag {
            json_name: (json_name != "-").then(|| json_name.to_string()),
            ..FieldTag::default()
        };
        for flag in words {
            match flag {
                "inline" => tag.inline = true,
                "keep" => tag.keep = true,
                "ptr" => tag.pointer = true,
                "omitzero" => tag.omitzero = true,
                "slice" => {
                    slices.insert(field.to_string());
                }
                _ => {
                    return Err(ProtobufError::Schema(format!(
                        "bad JSON tag flag in {line:?}"
                    )));
                }
            }
        }
        tags.insert(field.to_string(), tag);
    }
    Ok((tags, slices))
}
