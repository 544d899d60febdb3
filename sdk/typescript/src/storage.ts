// Pluggable storage for the local state (sync version, what is held per conversation,
// the conversation states). A small async key-value interface: React Native's
// AsyncStorage fits as it is; IndexedDB or localStorage take a few lines.

export interface StateStorage {
  get(key: string): Promise<string | null>;
  set(key: string, value: string): Promise<void>;
  remove(key: string): Promise<void>;
}

/** The default: kept in memory, gone with the process. */
export class MemoryStorage implements StateStorage {
  private readonly data = new Map<string, string>();

  async get(key: string): Promise<string | null> {
    return this.data.get(key) ?? null;
  }

  async set(key: string, value: string): Promise<void> {
    this.data.set(key, value);
  }

  async remove(key: string): Promise<void> {
    this.data.delete(key);
  }
}
