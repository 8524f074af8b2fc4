import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    // The validation suite's specs use the global describe/it/beforeAll.
    globals: true,
    include: ["test/**/*.spec.ts"],
    globalSetup: ["test/global-setup.ts"],
    // One server for all files; files run one after another (2 cores).
    fileParallelism: false,
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
