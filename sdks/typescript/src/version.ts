/** This package's version (package.json's; a unit test keeps them equal). */
export const VERSION = '0.1.0';

/** What a worker sends as Hello.sdk: this SDK and its version. */
export const SDK_NAME = `typescript/${VERSION}`;
