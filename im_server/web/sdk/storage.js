// Pluggable storage for the local state (sync version, what is held per conversation,
// the conversation states). A small async key-value interface: React Native's
// AsyncStorage fits as it is; IndexedDB or localStorage take a few lines.
/** The default: kept in memory, gone with the process. */
export class MemoryStorage {
    data = new Map();
    async get(key) {
        return this.data.get(key) ?? null;
    }
    async set(key, value) {
        this.data.set(key, value);
    }
    async remove(key) {
        this.data.delete(key);
    }
}
